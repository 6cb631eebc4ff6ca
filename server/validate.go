package server

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/fsm"
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", fence.ErrInvalidArgument, fmt.Sprintf(format, args...))
}

// checkText validates text that listings show: valid UTF-8, at most max
// bytes, and nothing that would make one name look like another or rewrite
// the listing around it: no control characters, no invisible formatting
// characters (U+200B, U+202E ...) and no line or paragraph separators.
// Names (required) must also not be empty or only whitespace, and their
// only space is U+0020.
func checkText(what, s string, max int, required bool) error {
	switch {
	case required && s == "":
		return invalid("%s is empty", what)
	case len(s) > max:
		return invalid("%s is %d bytes, over the limit of %d", what, len(s), max)
	case !utf8.ValidString(s):
		return invalid("%s is not valid UTF-8", what)
	case required && strings.TrimSpace(s) == "":
		return invalid("%s is only whitespace", what)
	}
	for i, r := range s {
		switch {
		case unicode.IsControl(r):
			return invalid("%s has control character %U at byte %d", what, r, i)
		case unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp):
			return invalid("%s has invisible or formatting character %U at byte %d", what, r, i)
		case required && r != ' ' && unicode.Is(unicode.Zs, r):
			return invalid("%s has space character %U at byte %d; names may use only the ASCII space", what, r, i)
		}
	}
	return nil
}

func (s *Server) checkLockName(name string) error {
	return checkText("lock name", name, s.cfg.MaxNameBytes, true)
}

func checkSessionID(id uint64) error {
	if id == 0 {
		return invalid("session_id is missing; create a session first")
	}
	return nil
}

// duration converts an optional protobuf duration; a nil one gives def.
func duration(what string, d *durationpb.Duration, def time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, invalid("%s: %v", what, err)
	}
	v := d.AsDuration()
	if v < 0 {
		return 0, invalid("%s %v is negative", what, v)
	}
	return v, nil
}

func (s *Server) sessionTTL(d *durationpb.Duration) (time.Duration, error) {
	ttl, err := duration("ttl", d, s.cfg.DefaultTTL)
	if err != nil {
		return 0, err
	}
	if ttl < s.cfg.MinTTL || ttl > s.cfg.MaxTTL {
		return 0, invalid("ttl %v is outside the allowed %v to %v", ttl, s.cfg.MinTTL, s.cfg.MaxTTL)
	}
	return ttl, nil
}

// lockDelay validates an acquire's optional lock-delay: not negative, at
// most the configured maximum.
func (s *Server) lockDelay(d *durationpb.Duration) (time.Duration, error) {
	delay, err := duration("lock_delay", d, 0)
	if err != nil {
		return 0, err
	}
	if delay > s.cfg.MaxLockDelay {
		return 0, invalid("lock_delay %v is over the limit of %v", delay, s.cfg.MaxLockDelay)
	}
	return delay, nil
}

func mode(m fencev1.Mode) (fsm.Mode, error) {
	switch m {
	case fencev1.Mode_MODE_UNSPECIFIED, fencev1.Mode_MODE_EXCLUSIVE:
		return fsm.Exclusive, nil
	case fencev1.Mode_MODE_SHARED:
		return fsm.Shared, nil
	case fencev1.Mode_MODE_SEMAPHORE:
		return fsm.Semaphore, nil
	}
	return 0, invalid("unknown mode %d; use MODE_EXCLUSIVE, MODE_SHARED or MODE_SEMAPHORE", m)
}

func apiMode(m fsm.Mode) fencev1.Mode {
	switch m {
	case fsm.Shared:
		return fencev1.Mode_MODE_SHARED
	case fsm.Semaphore:
		return fencev1.Mode_MODE_SEMAPHORE
	}
	return fencev1.Mode_MODE_EXCLUSIVE
}

// checkPermits checks an acquire's permits against its mode: a semaphore
// needs 1 to max, the other modes none.
func checkPermits(md fsm.Mode, permits uint32, max int) error {
	switch {
	case md != fsm.Semaphore && permits != 0:
		return invalid("permits is set (%d) but the mode is %s; permits are for MODE_SEMAPHORE", permits, md)
	case md == fsm.Semaphore && permits == 0:
		return invalid("a semaphore needs permits: how many holders it admits at once, 1 to %d", max)
	case md == fsm.Semaphore && int64(permits) > int64(max):
		return invalid("permits %d is over the limit of %d", permits, max)
	}
	return nil
}

// checkIdempotencyKey checks a unary call's Idempotency-Key header and
// returns it; "" for none. The stream checks its field the same way first,
// under the field's name (streamIdempotencyKey).
func checkIdempotencyKey(key string) (string, error) {
	return checkIdempotencyKeyAs(fencev1.IdempotencyKeyHeader+" header", key)
}

func checkIdempotencyKeyAs(what, key string) (string, error) {
	if err := checkText(what, key, fsm.MaxIdempotencyKeyBytes, false); err != nil {
		return "", err
	}
	return key, nil
}

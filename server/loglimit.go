package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/fencelock/fence/internal/clock"
)

// logLimitInterval is how often a logLimiter logs the lines of one key.
const logLimitInterval = time.Minute

// maxLimitedKeys bounds the keys a logLimiter remembers.
const maxLimitedKeys = 1024

// logLimiter logs a message under a key at most once a minute, and counts
// the ones it holds back: the next one it logs under the key says how many
// (suppressed=N). A key is one kind of trouble with one party (a peer
// unreachable, a peer refusing): another kind, or another party, is logged
// at once. The zero value is ready to use; it is safe for concurrent use.
type logLimiter struct {
	clock clock.Clock // nil: the real one
	mu    sync.Mutex
	keys  map[string]*limitedKey
}

// limitedKey is what a logLimiter remembers of one key.
type limitedKey struct {
	since      time.Time // when the key's first line was logged
	last       time.Time // when its last line was logged
	suppressed int       // lines held back since last
}

func (l *logLimiter) log(logger *slog.Logger, level slog.Level, key, msg string, args ...any) {
	suppressed, ok := l.admit(key)
	if !ok || logger == nil {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	logger.Log(context.Background(), level, msg, args...)
}

// admit reports whether a line under key is to be logged now, and how
// many lines under it were held back since the last one logged.
func (l *logLimiter) admit(key string) (suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	k := l.keys[key]
	if k != nil && now.Sub(k.last) < logLimitInterval {
		k.suppressed++
		return 0, false
	}
	if k == nil {
		l.makeRoomLocked(now)
		k = &limitedKey{since: now}
		l.keys[key] = k
	}
	suppressed, k.suppressed, k.last = k.suppressed, 0, now
	return suppressed, true
}

// forget drops key, so that its next line is logged at once, and returns
// when its first line was logged and how many were held back since the
// last; ok is false when no line was logged under key.
func (l *logLimiter) forget(key string) (since time.Time, suppressed int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := l.keys[key]
	if k == nil {
		return time.Time{}, 0, false
	}
	delete(l.keys, key)
	return k.since, k.suppressed, true
}

// makeRoomLocked drops the keys whose interval has passed once there are
// too many, and every key if that is not enough.
func (l *logLimiter) makeRoomLocked(now time.Time) {
	if l.keys == nil {
		l.keys = map[string]*limitedKey{}
	}
	if len(l.keys) < maxLimitedKeys {
		return
	}
	for key, k := range l.keys {
		if now.Sub(k.last) >= logLimitInterval {
			delete(l.keys, key)
		}
	}
	if len(l.keys) >= maxLimitedKeys {
		clear(l.keys)
	}
}

func (l *logLimiter) now() time.Time {
	if l.clock == nil {
		return clock.Real.Now()
	}
	return l.clock.Now()
}

package durable

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
)

// reserveBlock is how far ahead of the tokens it has applied a node
// reserves: one fsync per reserveBlock tokens, and a leader's first tokens
// jump by up to this much.
const reserveBlock = 1000

// ReserveFile is the token reserve's file in the data dir.
const ReserveFile = "token-reserve"

// TokenReserve is the second guard on fencing tokens (docs/design.md,
// "Tokens survive a damaged log"). The log is the first: tokens count up
// in the replicated state. But a log that loses its tail to damage nobody
// caught would bring a node back with a lower last token, and it would
// hand out again tokens it handed out before. So every node keeps, in a
// file of its own, a bound above every token it has applied, written and
// fsynced before any token past the old bound is answered to anyone, and
// raised a block at a time. A leader commits that bound as the token floor
// (RaiseTokens) before it serves, so its tokens start above it whatever its
// log says.
type TokenReserve struct {
	path string
	mu   sync.Mutex
	upTo uint64 // every token this node applied is at most upTo, on disk
	// full is set while the last write of the reserve found no space.
	full atomic.Bool
}

// Full reports whether the last write of the reserve found no space.
func (r *TokenReserve) Full() bool { return r.full.Load() }

// OpenTokenReserve reads the reserve of a data dir; a new data dir, or one
// written before reserves existed, starts with none.
func OpenTokenReserve(dataDir string) (*TokenReserve, error) {
	r := &TokenReserve{path: filepath.Join(dataDir, ReserveFile)}
	data, err := os.ReadFile(r.path)
	switch {
	case os.IsNotExist(err):
		return r, nil
	case err != nil:
		return nil, fmt.Errorf("reading the token reserve: %w", err)
	}
	var sum uint32
	if _, err := fmt.Sscanf(string(data), "up-to %d crc32c %x\n", &r.upTo, &sum); err != nil || sum != reserveSum(r.upTo) {
		return nil, fmt.Errorf("the token reserve %s is damaged (%q). It bounds the tokens this node has handed out, apart from the log. "+
			"If the log is intact, move the file aside and start again: the node then relies on the log alone for its tokens", r.path, strings.TrimSpace(string(data)))
	}
	return r, nil
}

// floor is the bound on every token this node has applied.
func (r *TokenReserve) Floor() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.upTo
}

// cover makes sure the reserve on disk is at least token, raising it a
// block ahead when it is not. It returns once the new bound is durable.
func (r *TokenReserve) Cover(token uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if token <= r.upTo {
		return nil
	}
	return r.setLocked(token + reserveBlock)
}

// set writes upTo as the reserve, raised or not: a restore sets the
// reserve of a new data dir to the restored state's last token.
func (r *TokenReserve) Set(upTo uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.setLocked(upTo)
}

func (r *TokenReserve) setLocked(upTo uint64) error {
	err := WriteDurably(r.path, fmt.Appendf(nil, "up-to %d crc32c %08x\n", upTo, reserveSum(upTo)))
	r.full.Store(errors.Is(err, syscall.ENOSPC))
	if err != nil {
		return fmt.Errorf("writing the token reserve: %w", err)
	}
	r.upTo = upTo
	return nil
}

// problem says what is wrong with the reserve, if anything.
func (r *TokenReserve) Problem() string {
	if r.full.Load() {
		return fmt.Sprintf("disk full: the token reserve %s could not be written; no grant past it is answered until it is", r.path)
	}
	return ""
}

func reserveSum(upTo uint64) uint32 {
	return crc32.Checksum(fmt.Appendf(nil, "%d", upTo), castagnoli)
}

// WriteDurably replaces the file at path with data: written to a temporary
// file, fsynced, renamed over path, and the directory fsynced, so that a
// crash leaves the old contents or the new, never a mix.
func WriteDurably(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

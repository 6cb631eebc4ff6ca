//go:build !unix

package durable

import "errors"

// FreeDiskBytes is not known here: a leader hands leadership over for its
// disk only once a write to it found no space.
func FreeDiskBytes(string) (uint64, error) { return 0, errors.ErrUnsupported }

// DataDirLock is a no-op where flock is missing: there, bbolt's own lock
// on raft.db is the only guard against two nodes on one data dir.
type DataDirLock struct{}

// LockDataDir locks nothing here.
func LockDataDir(string) (*DataDirLock, error) { return &DataDirLock{}, nil }

// Unlock does nothing here.
func (*DataDirLock) Unlock() error { return nil }

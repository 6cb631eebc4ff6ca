//go:build !unix

package server

import "errors"

// freeDiskBytes is not known here: a leader hands leadership over for its
// disk only once a write to it found no space.
func freeDiskBytes(string) (uint64, error) { return 0, errors.ErrUnsupported }

// dataDirLock is a no-op where flock is missing: there, bbolt's own lock
// on raft.db is the only guard against two nodes on one data dir.
type dataDirLock struct{}

func lockDataDir(string) (*dataDirLock, error) { return &dataDirLock{}, nil }

func (*dataDirLock) unlock() error { return nil }

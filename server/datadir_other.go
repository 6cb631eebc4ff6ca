//go:build !unix

package server

// dataDirLock is a no-op where flock is missing: there, bbolt's own lock
// on raft.db is the only guard against two nodes on one data dir.
type dataDirLock struct{}

func lockDataDir(string) (*dataDirLock, error) { return &dataDirLock{}, nil }

func (*dataDirLock) unlock() error { return nil }

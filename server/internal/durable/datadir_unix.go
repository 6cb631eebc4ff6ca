//go:build unix

package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// FreeDiskBytes returns the free space, for an unprivileged writer, of
// the disk that holds dir.
func FreeDiskBytes(dir string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

// DataDirLock is the lock a node holds on its data dir while it runs, so
// that a second node started on the same dir fails at once and names the
// process that has it, rather than wait forever on bbolt's file lock.
type DataDirLock struct{ f *os.File }

// lockFileName is the file in the data dir that is locked, and holds the
// pid of the process that locked it.
const lockFileName = "fence.pid"

// LockDataDir locks dir for this process and writes its pid there, or
// fails naming the process that holds it.
func LockDataDir(dir string) (*DataDirLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking data dir %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		defer f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			pid, _ := os.ReadFile(path)
			return nil, fmt.Errorf("data dir %s is in use by another fence process (pid %s); stop it, or give this one another --data-dir",
				dir, strings.TrimSpace(string(pid)))
		}
		return nil, fmt.Errorf("locking data dir %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &DataDirLock{f: f}, nil
}

// Unlock releases the data dir; the pid file stays, and names no one once
// its lock is free.
func (l *DataDirLock) Unlock() error {
	if l == nil {
		return nil
	}
	return l.f.Close() // closing the file releases the flock
}

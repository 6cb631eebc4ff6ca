//go:build unix

package server

import "syscall"

// openFileLimit returns the process's soft limit on open files, and
// whether it is known. Go's runtime has already raised it to the hard
// limit at start (package syscall's init); raising it here again would
// only stop Go from restoring the original limit for child processes.
func openFileLimit() (uint64, bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, false
	}
	return uint64(lim.Cur), true
}

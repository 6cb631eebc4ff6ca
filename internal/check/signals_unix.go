//go:build unix

package check

import "syscall"

// The signals that pause and resume a process.
const (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)

// canPause reports whether processes can be paused here.
func canPause() error { return nil }

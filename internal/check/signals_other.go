//go:build !unix

package check

import (
	"errors"
	"syscall"
)

// Pausing needs SIGSTOP and SIGCONT, which this system lacks; the values
// are never sent, as Run refuses to start (canPause).
const (
	sigStop = syscall.Signal(19)
	sigCont = syscall.Signal(18)
)

// canPause reports whether processes can be paused here.
func canPause() error {
	return errors.New("fence check pauses and resumes processes with SIGSTOP and SIGCONT, which this system lacks; run it on Linux or macOS")
}

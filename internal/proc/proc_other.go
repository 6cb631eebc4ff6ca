//go:build !unix

package proc

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
)

// CanPause reports whether Pause and Resume work here: they need SIGSTOP
// and SIGCONT, which this system lacks.
func CanPause() error {
	return fmt.Errorf("pausing a process needs SIGSTOP and SIGCONT, which %s lacks: %w", runtime.GOOS, errors.ErrUnsupported)
}

// setOwnGroup does nothing: process groups are a Unix notion.
func setOwnGroup(*syscall.SysProcAttr) {}

func pause(p *Process) error { return fmt.Errorf("pausing %s: %w", p.name, CanPause()) }

func resume(p *Process) error { return fmt.Errorf("resuming %s: %w", p.name, CanPause()) }

func terminate(p *Process) error { return killGroup(p) }

// killGroup kills the process alone: there is no group to reach.
func killGroup(p *Process) error {
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s (pid %d): %w", p.name, p.Pid(), err)
	}
	return nil
}

//go:build !unix

package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
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

// signalGroup signals the process alone, or kills it where sig cannot be
// sent: there is no group to reach.
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	err := cmd.Process.Signal(sig)
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		err = cmd.Process.Kill()
	}
	if err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("sending %v to pid %d: %w", sig, cmd.Process.Pid, err)
	}
	return nil
}

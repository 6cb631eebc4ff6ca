//go:build unix

package proc

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
)

// CanPause reports whether Pause and Resume work here: they do.
func CanPause() error { return nil }

// setOwnGroup starts the process in a process group of its own.
func setOwnGroup(a *syscall.SysProcAttr) { a.Setpgid = true }

func pause(p *Process) error { return p.Signal(syscall.SIGSTOP) }

func resume(p *Process) error { return p.Signal(syscall.SIGCONT) }

func terminate(p *Process) error {
	return errors.Join(resume(p), p.Signal(syscall.SIGTERM))
}

// killGroup continues and kills the process's group, which outlives the
// process while anything it started runs on. A group that is gone is not
// an error.
func killGroup(p *Process) error {
	for _, sig := range []syscall.Signal{syscall.SIGCONT, syscall.SIGKILL} {
		if err := syscall.Kill(-p.Pid(), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("sending %v to the group of %s (pid %d): %w", sig, p.name, p.Pid(), err)
		}
	}
	return nil
}

func signalGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	if err := syscall.Kill(-cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("sending %v to the group of pid %d: %w", sig, cmd.Process.Pid, err)
	}
	return nil
}

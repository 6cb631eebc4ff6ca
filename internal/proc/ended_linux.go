package proc

import (
	"errors"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// Ended reports whether cmd's process has exited, whether or not it has
// been waited for yet: it asks the kernel without reaping the process
// (WNOWAIT), so that cmd.Wait still gets its status. It reports false for
// a process that has not been started.
func Ended(cmd *exec.Cmd) bool {
	if cmd.Process == nil {
		return false
	}
	var info unix.Siginfo // zeroed: Signo stays 0 while the process runs
	err := unix.Waitid(unix.P_PID, cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	if errors.Is(err, syscall.ECHILD) {
		return true // already reaped by cmd.Wait
	}
	return err == nil && info.Signo == int32(syscall.SIGCHLD)
}

package cli

import (
	"os/exec"
	"syscall"
)

// guardChild makes the kernel kill CMD if `fence lock` itself dies (kill -9
// included): a child must never run on once nothing holds its lock.
func guardChild(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

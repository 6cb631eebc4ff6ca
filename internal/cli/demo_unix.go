//go:build unix

package cli

import (
	"os"
	"os/exec"
	"syscall"
)

// pauseProcess stops p as a GC pause or a VM migration would: SIGSTOP.
func pauseProcess(p *os.Process) error { return p.Signal(syscall.SIGSTOP) }

// resumeProcess lets a stopped p run again: SIGCONT.
func resumeProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }

// isolateWorker puts a demo worker in its own process group, so that a
// Ctrl-C at the terminal reaches only the demo, which then stops its
// workers in order; and, on Linux, has the kernel kill the worker if the
// demo dies.
func isolateWorker(cmd *exec.Cmd) {
	guardChild(cmd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

//go:build linux || darwin

package proc

import (
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// ForegroundTerminal gives cmd's process group the terminal tty, when tty
// is one and this process's group has it in the foreground: a command in
// a group of its own (OwnGroup) would otherwise be stopped (SIGTTIN) the
// moment it read from the terminal, as a background job is. The terminal's
// own signals (Ctrl-C) then go to the command's group. Call it before
// cmd starts; the function it returns gives the terminal back once the
// command has exited, so that whatever runs after this process in the
// same shell can read from it.
func ForegroundTerminal(cmd *exec.Cmd, tty *os.File) (giveBack func()) {
	if tty == nil {
		return func() {}
	}
	fd := int(tty.Fd())
	ours := syscall.Getpgrp()
	if fg, err := unix.IoctlGetInt(fd, unix.TIOCGPGRP); err != nil || fg != ours {
		return func() {} // not a terminal, or this process runs in the background
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Foreground = true
	cmd.SysProcAttr.Ctty = fd
	return func() {
		// This process is in the background now: taking the terminal
		// back would stop it with SIGTTOU unless that is ignored.
		signal.Ignore(syscall.SIGTTOU)
		defer signal.Reset(syscall.SIGTTOU)
		_ = unix.IoctlSetPointerInt(fd, unix.TIOCSPGRP, ours)
	}
}

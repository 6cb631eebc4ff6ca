package proc

import "syscall"

// setDieWithParent sets the parent-death signal: SIGKILL.
func setDieWithParent(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

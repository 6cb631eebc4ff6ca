//go:build !linux

package proc

import "syscall"

// setDieWithParent does nothing: only Linux has a parent-death signal.
func setDieWithParent(*syscall.SysProcAttr) {}

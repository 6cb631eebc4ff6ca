//go:build !linux

package cli

import "os/exec"

// guardChild has no portable equivalent of Linux's parent-death signal.
func guardChild(cmd *exec.Cmd) {}

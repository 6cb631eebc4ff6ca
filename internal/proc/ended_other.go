//go:build !linux

package proc

import "os/exec"

// Ended reports whether cmd's process has exited, whether or not it has
// been waited for yet. Only Linux can tell without reaping the process
// (waitid with WNOWAIT); elsewhere it reports false, as for a process that
// still runs.
func Ended(*exec.Cmd) bool { return false }

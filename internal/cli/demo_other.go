//go:build !unix

package cli

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
)

// pauseProcess needs SIGSTOP, which this system lacks.
func pauseProcess(p *os.Process) error {
	return fmt.Errorf("fence demo pauses a worker with SIGSTOP, which %s does not have", runtime.GOOS)
}

// resumeProcess needs SIGCONT, which this system lacks.
func resumeProcess(p *os.Process) error {
	return fmt.Errorf("fence demo resumes a worker with SIGCONT, which %s does not have", runtime.GOOS)
}

// isolateWorker has the kernel kill the worker if the demo dies, where it can.
func isolateWorker(cmd *exec.Cmd) { guardChild(cmd) }

// Package proc runs the child processes that fence's tool and tests start,
// pause, kill and collect: the command that `fence lock` runs under a lock,
// the workers of `fence demo` and `fence check`, the servers the checker
// kills and restarts, and the processes of the end-to-end tests.
//
// A Process runs in its own process group, so that a Ctrl-C at the
// terminal reaches only its parent, which then stops it in order, and so
// that Kill also reaches whatever it started itself. Pause and Resume stop
// and continue it as a GC pause or a VM migration would, with SIGSTOP and
// SIGCONT; where the system lacks those signals they fail with an error
// wrapping errors.ErrUnsupported (see CanPause). The package reaps every
// process it starts; Done, Exited and Wait tell when that happened.
//
// Besides tests and their scaffolding, only the fence tool imports it:
// `fence lock -- CMD` runs its command through OwnGroup, DieWithParent and
// ForegroundTerminal, and the demo and the checker run their workers and
// nodes as Processes. Tests outside cmd/fence use it as well (the end-to-end
// tests, recipetest), so it lives in internal/ rather than
// cmd/fence/internal/. It is process control, not test scaffolding: it
// stands on a floor of its own, above the libraries, which never import
// it, and below internal/testutil/ and the tool.
package proc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// waitDelay bounds how long reaping a process that exited waits for its
// output pipes to close (a grandchild may hold them open).
const waitDelay = 5 * time.Second

// maxLine bounds one line of standard output delivered on Lines.
const maxLine = 16 << 20

// Spec says how to start a process.
type Spec struct {
	// Name names the process in errors, as in "worker A".
	Name string
	// Path is the executable; Args are its arguments, without argv[0].
	Path string
	Args []string
	// Dir and Env are as in exec.Cmd: empty means the parent's.
	Dir string
	Env []string
	// Stdin gives the process a pipe on its standard input, written with
	// WriteLine; without it the process reads from the null device.
	Stdin bool
	// Lines delivers standard output line by line on Process.Lines. The
	// process is reaped only once its standard output is read to the end,
	// so someone must read Lines until it closes, or Kill the process.
	Lines bool
	// Stdout receives standard output when Lines is false; nil discards it.
	Stdout io.Writer
	// Stderr, when set, receives standard error as well as the process's
	// own record of it (see StderrBytes).
	Stderr io.Writer
	// StderrBytes bounds how much of the end of standard error
	// Process.Stderr keeps; 0 keeps it all.
	StderrBytes int
	// DieWithParent has the kernel kill the process when its parent dies,
	// kill -9 included, where the system can (see DieWithParent).
	DieWithParent bool
}

// Line is one line a process wrote to its standard output.
type Line struct {
	Text string    // without the newline
	At   time.Time // when the parent read it
}

// Process is a running (or exited) child process. Its methods are safe for
// concurrent use.
type Process struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser // nil without Spec.Stdin
	stderr *Tail
	lines  chan Line     // nil without Spec.Lines
	done   chan struct{} // closed once the process is reaped
}

// Start starts the process described by s.
func Start(s Spec) (*Process, error) {
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Dir, cmd.Env = s.Dir, s.Env
	cmd.WaitDelay = waitDelay
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	setOwnGroup(cmd.SysProcAttr)
	if s.DieWithParent {
		DieWithParent(cmd)
	}
	p := &Process{name: s.Name, cmd: cmd, stderr: &Tail{Max: s.StderrBytes}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	if s.Stderr != nil {
		cmd.Stderr = io.MultiWriter(p.stderr, s.Stderr)
	}
	stdout, err := p.pipes(s)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", s.Name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", s.Name, err)
	}
	go p.reap(stdout)
	return p, nil
}

// pipes connects standard input and output as s asks, and returns the
// standard output to read lines from, if any.
func (p *Process) pipes(s Spec) (io.Reader, error) {
	var err error
	if s.Stdin {
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			return nil, err
		}
	}
	if !s.Lines {
		p.cmd.Stdout = s.Stdout
		return nil, nil
	}
	p.lines = make(chan Line, 16)
	return p.cmd.StdoutPipe()
}

// reap delivers the lines of stdout, if it is read here, then waits for
// the process.
func (p *Process) reap(stdout io.Reader) {
	if stdout != nil {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), maxLine)
		for sc.Scan() {
			p.lines <- Line{Text: sc.Text(), At: time.Now()}
		}
		_, _ = io.Copy(io.Discard, stdout) // past a line too long, so it does not block
	}
	_ = p.cmd.Wait() // the status is read from ProcessState
	close(p.done)
	if p.lines != nil {
		close(p.lines) // after done: a reader that saw it closed sees the state
	}
}

// Name returns the name the process was started with.
func (p *Process) Name() string { return p.name }

// Pid returns the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Lines returns the lines of standard output (with Spec.Lines; nil
// otherwise). It is closed once the process has been reaped.
func (p *Process) Lines() <-chan Line { return p.lines }

// WriteLine writes line and a newline to the process's standard input
// (with Spec.Stdin).
func (p *Process) WriteLine(line string) error {
	if p.stdin == nil {
		return fmt.Errorf("%s has no standard input to write to", p.name)
	}
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		return fmt.Errorf("writing to %s: %w", p.name, err)
	}
	return nil
}

// Stderr returns what the process wrote to its standard error, or its end
// (Spec.StderrBytes).
func (p *Process) Stderr() string { return p.stderr.String() }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited and been reaped.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// State returns how the process exited, or nil while it runs.
func (p *Process) State() *os.ProcessState {
	if !p.Exited() {
		return nil
	}
	return p.cmd.ProcessState
}

// ExitCode returns the process's exit status: -1 while it runs, or if a
// signal ended it.
func (p *Process) ExitCode() int {
	if st := p.State(); st != nil {
		return st.ExitCode()
	}
	return -1
}

// Wait waits until the process has exited and been reaped, for at most
// timeout (none when it is 0) and until ctx ends. An exit status other
// than 0 is not an error: see ExitCode.
func (p *Process) Wait(ctx context.Context, timeout time.Duration) error {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-p.done:
		return nil
	case <-expired:
		return fmt.Errorf("%s (pid %d) did not exit within %v", p.name, p.Pid(), timeout)
	case <-ctx.Done():
		return fmt.Errorf("waiting for %s (pid %d) to exit: %w", p.name, p.Pid(), ctx.Err())
	}
}

// Signal sends sig to the process alone, not its group.
func (p *Process) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("sending %v to %s (pid %d): %w", sig, p.name, p.Pid(), err)
	}
	return nil
}

// Pause stops the process (SIGSTOP), as a GC pause or a VM migration
// would; what it started runs on.
func (p *Process) Pause() error { return pause(p) }

// Resume continues a paused process (SIGCONT).
func (p *Process) Resume() error { return resume(p) }

// PauseWhile is the pause fault: it pauses the process, runs during, and
// resumes the process, also when during fails. It returns when the process
// was paused (after it was stopped, until it was continued), and the first
// error of pausing, during and resuming.
func (p *Process) PauseWhile(ctx context.Context, during func(context.Context) error) (paused, resumed time.Time, err error) {
	if err := p.Pause(); err != nil {
		return time.Time{}, time.Time{}, err
	}
	paused = time.Now()
	err = during(ctx)
	if rerr := p.Resume(); err == nil {
		err = rerr
	}
	return paused, time.Now(), err
}

// Terminate asks the process to exit: it continues it if it was paused,
// then sends SIGTERM; where there is no SIGTERM, it kills it. It does not
// wait.
func (p *Process) Terminate() error { return terminate(p) }

// Kill continues and kills the process's whole group (SIGCONT, SIGKILL)
// and closes its standard input. It does not wait: see Wait and Done, and
// read Lines to its end, or the process is never reaped.
func (p *Process) Kill() error {
	err := killGroup(p)
	if p.stdin != nil {
		_ = p.stdin.Close()
	}
	return err
}

// DieWithParent has the kernel kill cmd's process when this process dies,
// kill -9 included. Only Linux can (the parent-death signal); elsewhere it
// does nothing. Call it before cmd.Start.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	setDieWithParent(cmd.SysProcAttr)
}

// OwnGroup has cmd's process start in a process group of its own, which
// it leads, where the system has groups (Unix); elsewhere it does nothing.
// SignalGroup then reaches whatever the process started as well. Call it
// before cmd.Start.
func OwnGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	setOwnGroup(cmd.SysProcAttr)
}

// SignalGroup sends sig to the process group that cmd's process leads
// (see OwnGroup). Where there are no groups, it sends sig to the process
// alone, and where sig cannot be sent (Windows has only kill), it kills
// the process. A group that is gone is not an error.
func SignalGroup(cmd *exec.Cmd, sig syscall.Signal) error { return signalGroup(cmd, sig) }

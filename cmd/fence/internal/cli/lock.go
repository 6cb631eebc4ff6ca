package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/proc"
)

type lockFlags struct {
	ttl       time.Duration
	timeout   time.Duration
	lockDelay time.Duration
	grace     time.Duration
	shared    bool
	try       bool
	permits   int
	semaphore bool // --permits was given
}

// register adds the flags that fence lock and fence run-once share: how
// the lock is waited for and held, and how CMD is stopped.
func (f *lockFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 10*time.Second, "session TTL: how long the lock survives without renewals")
	fl.DurationVar(&f.timeout, "timeout", 0, "give up waiting for the lock after this long, exit 124 (0: wait forever)")
	fl.BoolVar(&f.try, "try", false, "do not wait: if the lock is held, exit 124 at once (flock -n)")
	fl.DurationVar(&f.lockDelay, "lock-delay", 0, "if the session ends without releasing the lock (expired, revoked, given up), keep it from others this long")
	fl.DurationVar(&f.grace, "grace", 5*time.Second, "time CMD has to exit after a signal, before SIGKILL")
	cmd.MarkFlagsMutuallyExclusive("try", "timeout")
}

// lockUsage is the usage line of fence lock, printed with every mistake in
// its arguments.
const lockUsage = "usage: fence lock [flags] NAME -- CMD [ARGS...]"

// lockArgs checks fence lock's arguments: NAME, then --, then a command.
func lockArgs(cmd *cobra.Command, args []string) error {
	return dashArgs(cmd, args, "lock", "lock NAME", lockUsage)
}

// dashArgs checks the arguments of a command that wraps another, fence lock
// or fence run-once: one what (a lock NAME, a KEY), then --, then the
// command to run.
func dashArgs(cmd *cobra.Command, args []string, name, what, usage string) error {
	switch dash := cmd.ArgsLenAtDash(); {
	case dash == -1 && len(args) <= 1:
		return fmt.Errorf("fence %s needs a %s, then -- and the command to run\n%s", name, what, usage)
	case dash == -1:
		return fmt.Errorf("put -- between the %s and the command (%q ...)\n%s", what, args[1], usage)
	case dash == 0:
		return fmt.Errorf("fence %s needs a %s before --\n%s", name, what, usage)
	case dash > 1:
		return fmt.Errorf("fence %s takes one %s before --, not %d\n%s", name, what, dash, usage)
	case len(args) == 1:
		return fmt.Errorf("fence %s needs a command after --\n%s", name, usage)
	}
	return nil
}

func lockCommand(g *globals) *cobra.Command {
	var f lockFlags
	cmd := &cobra.Command{
		Use:   "lock [flags] NAME -- CMD [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Waits for the lock NAME, runs CMD with FENCE_LOCK, FENCE_TOKEN and
FENCE_SESSION in its environment, releases the lock when CMD exits, and exits
with CMD's status. With --try, gives up at once if the lock is held (like
flock -n), with the status of a --timeout that passed.

If the lock may have been lost while CMD runs (the session's safe-until
deadline passed without a renewal), CMD gets SIGTERM, then SIGKILL after
--grace, and fence exits with status 75. Pass FENCE_TOKEN with every write, so
that the resource can reject a write made after the lock was lost.

CMD runs in a process group of its own. SIGINT, SIGTERM and SIGHUP to fence
lock are passed on to that group as they came (a Ctrl-C is fence's to pass
on); the group gets SIGKILL if CMD has not exited --grace later, then the
lock is released and fence exits with CMD's status. While fence waits for
the lock, any of them gives up the wait (exit 128+N).

With --permits N, NAME is a semaphore: up to N commands run at once, each
with its own token (like consul lock -n N).

CMD is looked up before any lock is taken: a command that cannot be run
is refused at once.

Exit status: CMD's own; 124 if the lock was not granted within --timeout, or
at once with --try; 75 if the lock was lost; 126/127 if CMD could not be
run; 128+N if signal N stopped the wait; 1 on other errors.`,
		Args: lockArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f.semaphore = cmd.Flags().Changed("permits")
			return runLocked(cmd.Context(), g, f, args[0], args[1:])
		},
	}
	f.register(cmd)
	fl := cmd.Flags()
	fl.BoolVar(&f.shared, "shared", false, "take the lock in shared (read) mode, alongside other shared holders")
	fl.IntVar(&f.permits, "permits", 0, "make NAME a semaphore of this many permits and hold one (every holder must pass the same number)")
	cmd.MarkFlagsMutuallyExclusive("shared", "permits")
	return cmd
}

// forwarded are the signals fence lock passes on to its command.
var forwarded = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// signalOf returns the signal that ended ctx: one of forwarded, read from
// sigs, when ctx was ended by signal.NotifyContext (main's or ours), and
// SIGTERM when it was cancelled otherwise (Run called from Go).
func signalOf(ctx context.Context, sigs <-chan os.Signal) syscall.Signal {
	if context.Cause(ctx) == ctx.Err() {
		return syscall.SIGTERM // no signal: cancelled by a caller
	}
	// A signal ended ctx, and Notify delivers it on sigs as well; the bound
	// is for a caller's own cause, which no signal follows.
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case sig := <-sigs:
		if sig, ok := sig.(syscall.Signal); ok {
			return sig
		}
	case <-t.C:
	}
	return syscall.SIGTERM
}

func runLocked(ctx context.Context, g *globals, f lockFlags, name string, argv []string) error {
	return runHolding(ctx, g, f, name, argv, lockHooks{command: "fence lock"})
}

// lockHooks let a command built on fence lock (fence run-once) act while
// it holds the lock; fence lock itself has none.
type lockHooks struct {
	// command is the command the user ran ("fence lock", "fence
	// run-once"), which starts every line the run writes to stderr.
	command string
	// held runs once the lock is held, before CMD starts. An error keeps
	// CMD from starting: the lock is released and the run ends with it.
	held func(ctx context.Context, c *client.Client, grant *client.Grant) error
	// ended runs when CMD has exited by itself, even if the lock was found
	// lost meanwhile (then CMD's end, not the loss, decides), with CMD's
	// Wait error; it runs before the lock is released, and what it returns
	// ends the run.
	ended func(ctx context.Context, c *client.Client, grant *client.Grant, exit error) error
}

// runHolding runs argv while it holds the lock name, as fence lock does,
// and calls h around it. A command that cannot be run (not found, not
// executable) is refused before any session or lock is taken.
func runHolding(ctx context.Context, g *globals, f lockFlags, name string, argv []string, h lockHooks) error {
	if _, err := exec.LookPath(argv[0]); err != nil {
		return &ExitError{Code: execErrorCode(err), Err: fmt.Errorf("cannot run %s: %w (nothing was run, no lock was taken)", argv[0], err)}
	}
	sigs := make(chan os.Signal, len(forwarded))
	signal.Notify(sigs, forwarded...)
	defer signal.Stop(sigs)
	// main diverts SIGINT and SIGTERM to ctx; SIGHUP too, while we wait.
	waitCtx, stopWaitSignals := signal.NotifyContext(ctx, syscall.SIGHUP)
	defer stopWaitSignals()

	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	host, _ := os.Hostname()
	s, err := c.NewSession(waitCtx, client.WithTTL(f.ttl), client.WithOwner(fmt.Sprintf("fence lock pid %d on %s", os.Getpid(), host)))
	if err != nil {
		if waitCtx.Err() != nil {
			return interruptedWait(waitCtx, sigs, name)
		}
		return fmt.Errorf("creating session: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(closeCtx)
	}()

	grant, unlock, err := acquireLock(waitCtx, s, f, name)
	if err != nil {
		return notAcquired(waitCtx, c, f, name, sigs, err)
	}
	stopWaitSignals() // from here on, sigs alone sees SIGHUP
	if h.held != nil {
		if err := h.held(ctx, c, grant); err != nil {
			unlockCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = unlock(unlockCtx)
			return err
		}
	}

	child, exited, giveBack, err := startHolder(g, argv, name, grant.Token(), s.ID())
	if err != nil {
		_ = unlock(context.Background())
		return err
	}
	defer giveBack()
	held := &heldRun{g: g, f: f, h: h, c: c, name: name, grant: grant, unlock: unlock, child: child, exited: exited}
	return held.wait(ctx, sigs)
}

// heldRun is a command running under a lock it holds (runHolding).
type heldRun struct {
	g      *globals
	f      lockFlags
	h      lockHooks
	c      *client.Client
	name   string
	grant  *client.Grant
	unlock func(context.Context) error
	child  *exec.Cmd
	exited <-chan error
}

// wait waits until the command exits, the lock may be lost (the command
// is stopped), or fence is told to stop (the signal is passed on), and
// releases the lock; it returns fence's exit.
func (r *heldRun) wait(ctx context.Context, sigs <-chan os.Signal) error {
	g, f, h, child, exited := r.g, r.f, r.h, r.child, r.exited
	select {
	case err := <-exited:
		return r.end(ctx, err)
	case <-r.grant.Done():
		if h.ended != nil && proc.Ended(child) {
			return r.end(ctx, <-exited)
		}
		fmt.Fprintf(g.stderr, "%s: lock %q (token %d) may be lost: %s; stopping %s\n", h.command, r.name, r.grant.Token(), errorText(r.grant.Err()), child.Args[0])
		stopChild(child, exited, syscall.SIGTERM, f.grace, g, h.command)
		return &ExitError{Code: exitLockLost}
	case sig := <-sigs:
		// fence itself was told to stop: pass it on, then release.
		err := stopChild(child, exited, sig.(syscall.Signal), f.grace, g, h.command)
		r.release()
		return exitStatus(err)
	case <-ctx.Done():
		sig := signalOf(ctx, sigs)
		err := stopChild(child, exited, sig, f.grace, g, h.command)
		r.release()
		if context.Cause(ctx) == ctx.Err() {
			return &ExitError{Code: 128 + int(sig)}
		}
		return exitStatus(err)
	}
}

// end is the exit of a command that ended by itself, as the hook says.
func (r *heldRun) end(ctx context.Context, err error) error {
	if r.h.ended != nil {
		err = r.h.ended(ctx, r.c, r.grant, err)
	}
	r.release()
	return exitStatus(err)
}

// release releases the lock, saying so if that fails while it is held.
func (r *heldRun) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.unlock(ctx); err != nil && r.grant.Err() == nil {
		fmt.Fprintf(r.g.stderr, "%s: releasing %q: %s\n", r.h.command, r.name, errorText(err))
	}
}

// notAcquired is fence lock's answer to err, the failure to acquire lock
// name: a timeout or a --try refusal exit with exitTimeout, an interrupted
// wait as the signal says.
func notAcquired(waitCtx context.Context, c *client.Client, f lockFlags, name string, sigs <-chan os.Signal, err error) error {
	switch {
	case errors.Is(err, fence.ErrWaitTimeout):
		return &ExitError{Code: exitTimeout, Err: fmt.Errorf("lock %q was not granted within %v", name, f.timeout)}
	case errors.Is(err, fence.ErrLocked) && f.try:
		return &ExitError{Code: exitTimeout, Err: tryRefused(waitCtx, c, name, err)}
	case waitCtx.Err() != nil:
		return interruptedWait(waitCtx, sigs, name)
	}
	return fmt.Errorf("acquiring lock %q: %w", name, err)
}

// startHolder starts argv as the holder of lock name: in a process group
// of its own (a signal reaches whatever it starts), dying with fence (it
// must never run on once nothing holds its lock), with the terminal if
// fence has it (psql, a prompt), and the lock, its token and session in
// its environment. It returns the child, its exit, and what gives the
// terminal back.
func startHolder(g *globals, argv []string, name string, token, session uint64) (*exec.Cmd, <-chan error, func(), error) {
	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = g.stdin, g.stdout, g.stderr
	proc.OwnGroup(child)
	proc.DieWithParent(child)
	giveBack := func() {}
	if tty, ok := g.stdin.(*os.File); ok {
		giveBack = proc.ForegroundTerminal(child, tty)
	}
	child.Env = append(os.Environ(),
		"FENCE_LOCK="+name,
		"FENCE_TOKEN="+strconv.FormatUint(token, 10),
		"FENCE_SESSION="+strconv.FormatUint(session, 10),
	)
	if err := child.Start(); err != nil {
		giveBack()
		return nil, nil, nil, &ExitError{Code: execErrorCode(err), Err: fmt.Errorf("starting %s: %w", argv[0], err)}
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()
	return child, exited, giveBack, nil
}

// acquireLock takes the lock as f says: shared, a semaphore's permit, or
// exclusive; at once or failing with fence.ErrLocked, with --try.
func acquireLock(ctx context.Context, s *client.Session, f lockFlags, name string) (*client.Grant, func(context.Context) error, error) {
	var opts []client.LockOption
	if f.timeout > 0 {
		opts = append(opts, client.WithWaitTimeout(f.timeout))
	}
	if f.lockDelay > 0 {
		opts = append(opts, client.WithLockDelay(f.lockDelay))
	}
	var take, tryTake func(context.Context) (*client.Grant, error)
	var release func(context.Context) error
	switch {
	case f.shared:
		rw := client.NewRWMutex(s, name, opts...)
		take, tryTake, release = rw.RLock, rw.TryRLock, rw.RUnlock
	case f.semaphore:
		sm := client.NewSemaphore(s, name, f.permits, opts...)
		take, tryTake, release = sm.Acquire, sm.TryAcquire, sm.Release
	default:
		m := client.NewMutex(s, name, opts...)
		take, tryTake, release = m.Lock, m.TryLock, m.Unlock
	}
	if f.try {
		take = tryTake
	}
	g, err := take(ctx)
	return g, release, err
}

// tryRefused is the error of --try on a held lock: who holds it, when the
// service said so (heldError, as fence lease acquire says it), and that
// --try does not wait.
func tryRefused(ctx context.Context, c *client.Client, name string, err error) error {
	var locked *fence.LockedError
	if errors.As(err, &locked) && locked.Reason != "" {
		return say(err, "%s, and --try does not wait", heldError(ctx, c, locked))
	}
	return say(err, "lock %q is held, and --try does not wait", name)
}

// interruptedWait is the error of a wait for the lock that a signal (or
// the caller) ended: exit 128+N.
func interruptedWait(ctx context.Context, sigs <-chan os.Signal, name string) error {
	sig := signalOf(ctx, sigs)
	return &ExitError{Code: 128 + int(sig), Err: fmt.Errorf("stopped waiting for lock %q: %v", name, sig)}
}

// stopChild sends sig to the child's process group, then SIGKILL to the
// group after grace, and returns the child's exit. Where sig cannot be sent
// (Windows has no signals but kill), the child is ended at once with the
// system's means (TerminateProcess on Windows). What it says starts with
// command.
func stopChild(child *exec.Cmd, exited <-chan error, sig syscall.Signal, grace time.Duration, g *globals, command string) error {
	if err := proc.SignalGroup(child, sig); err != nil {
		fmt.Fprintf(g.stderr, "%s: %v\n", command, err)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
		fmt.Fprintf(g.stderr, "%s: %s did not exit within %v of %v; sending SIGKILL\n", command, child.Path, grace, sig)
		if err := proc.SignalGroup(child, syscall.SIGKILL); err != nil {
			fmt.Fprintf(g.stderr, "%s: %v\n", command, err)
		}
		return <-exited
	}
}

// execErrorCode is the exit status for a command that cannot be run: 127
// if it was not found, 126 otherwise (not executable, a directory), as a
// shell's.
func execErrorCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return exitNotFound
	}
	return exitNoExec
}

// exitStatus turns a child's exit into fence's: the same code, or 128+N
// for a child killed by signal N.
func exitStatus(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return &ExitError{Code: 128 + int(ws.Signal())}
		}
		return &ExitError{Code: ee.ExitCode()}
	}
	return err
}

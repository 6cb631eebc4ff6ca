package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
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
	permits   int
	semaphore bool // --permits was given
}

func lockCommand(g *globals) *cobra.Command {
	var f lockFlags
	cmd := &cobra.Command{
		Use:   "lock [flags] NAME -- CMD [ARGS...]",
		Short: "Run a command while holding a lock",
		Long: `Waits for the lock NAME, runs CMD with FENCE_LOCK, FENCE_TOKEN and
FENCE_SESSION in its environment, releases the lock when CMD exits, and exits
with CMD's status.

If the lock may have been lost while CMD runs (the session's safe-until
deadline passed without a renewal), CMD gets SIGTERM, then SIGKILL after
--grace, and fence exits with status 75. Pass FENCE_TOKEN with every write, so
that the resource can reject a write made after the lock was lost.

With --permits N, NAME is a semaphore: up to N commands run at once, each
with its own token (like consul lock -n N).

Exit status: CMD's own; 124 if the lock was not granted within --timeout;
75 if the lock was lost; 126/127 if CMD could not be run; 1 on other errors.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() != 1 {
				return fmt.Errorf("usage: fence lock [flags] NAME -- CMD [ARGS...]")
			}
			f.semaphore = cmd.Flags().Changed("permits")
			return runLocked(cmd.Context(), g, f, args[0], args[1:])
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.ttl, "ttl", 10*time.Second, "session TTL: how long the lock survives without renewals")
	fl.DurationVar(&f.timeout, "timeout", 0, "give up waiting for the lock after this long (0: wait forever)")
	fl.DurationVar(&f.lockDelay, "lock-delay", 0, "if the session expires, keep the lock from others this long")
	fl.DurationVar(&f.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when the lock is lost")
	fl.BoolVar(&f.shared, "shared", false, "take the lock in shared (read) mode, alongside other shared holders")
	fl.IntVar(&f.permits, "permits", 0, "make NAME a semaphore of this many permits and hold one (every holder must pass the same number)")
	cmd.MarkFlagsMutuallyExclusive("shared", "permits")
	return cmd
}

func runLocked(ctx context.Context, g *globals, f lockFlags, name string, argv []string) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	host, _ := os.Hostname()
	s, err := c.NewSession(ctx, client.WithTTL(f.ttl), client.WithOwner(fmt.Sprintf("fence lock pid %d on %s", os.Getpid(), host)))
	if err != nil {
		return fmt.Errorf("creating session: %w", err)
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(closeCtx)
	}()

	var opts []client.LockOption
	if f.timeout > 0 {
		opts = append(opts, client.WithWaitTimeout(f.timeout))
	}
	if f.lockDelay > 0 {
		opts = append(opts, client.WithLockDelay(f.lockDelay))
	}
	var (
		grant  *client.Grant
		unlock func(context.Context) error
	)
	switch {
	case f.shared:
		rw := client.NewRWMutex(s, name, opts...)
		grant, err = rw.RLock(ctx)
		unlock = rw.RUnlock
	case f.semaphore:
		sm := client.NewSemaphore(s, name, f.permits, opts...)
		grant, err = sm.Acquire(ctx)
		unlock = sm.Release
	default:
		m := client.NewMutex(s, name, opts...)
		grant, err = m.Lock(ctx)
		unlock = m.Unlock
	}
	if errors.Is(err, fence.ErrWaitTimeout) {
		return &ExitError{Code: exitTimeout, Err: fmt.Errorf("lock %q was not granted within %v", name, f.timeout)}
	}
	if err != nil {
		return fmt.Errorf("acquiring lock %q: %w", name, err)
	}

	child := exec.Command(argv[0], argv[1:]...)
	child.Stdin, child.Stdout, child.Stderr = g.stdin, g.stdout, g.stderr
	proc.DieWithParent(child) // it must never run on once nothing holds its lock
	child.Env = append(os.Environ(),
		"FENCE_LOCK="+name,
		"FENCE_TOKEN="+strconv.FormatUint(grant.Token(), 10),
		"FENCE_SESSION="+strconv.FormatUint(s.ID(), 10),
	)
	if err := child.Start(); err != nil {
		_ = unlock(context.Background())
		code := exitNoExec
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = exitNotFound
		}
		return &ExitError{Code: code, Err: fmt.Errorf("starting %s: %w", argv[0], err)}
	}
	exited := make(chan error, 1)
	go func() { exited <- child.Wait() }()

	select {
	case err := <-exited:
		unlockCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if uerr := unlock(unlockCtx); uerr != nil && grant.Err() == nil {
			fmt.Fprintf(g.stderr, "fence lock: releasing %q: %v\n", name, uerr)
		}
		return exitStatus(err)
	case <-grant.Done():
		fmt.Fprintf(g.stderr, "fence lock: lock %q (token %d) may be lost: %v; stopping %s\n", name, grant.Token(), grant.Err(), argv[0])
		stopChild(child, exited, f.grace, g)
		return &ExitError{Code: exitLockLost}
	case <-ctx.Done():
		// fence itself was told to stop: pass it on, then release.
		stopChild(child, exited, f.grace, g)
		_ = unlock(context.Background())
		return &ExitError{Code: 128 + int(syscall.SIGTERM)}
	}
}

// stopChild sends SIGTERM, then SIGKILL after grace, and waits for the exit.
// Where SIGTERM cannot be sent (Windows has no signals but kill), the child
// is ended at once with the system's means (TerminateProcess on Windows).
func stopChild(child *exec.Cmd, exited <-chan error, grace time.Duration, g *globals) {
	if err := child.Process.Signal(syscall.SIGTERM); err != nil {
		_ = child.Process.Kill()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		fmt.Fprintf(g.stderr, "fence lock: %s did not exit within %v of SIGTERM; sending SIGKILL\n", child.Path, grace)
		_ = child.Process.Kill()
		<-exited
	}
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

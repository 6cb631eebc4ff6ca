package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
)

// runOnceUsage is the usage line of fence run-once, printed with every
// mistake in its arguments.
const runOnceUsage = "usage: fence run-once [flags] KEY -- CMD [ARGS...]"

// runOnceRecordTimeout bounds the write that records a run done.
const runOnceRecordTimeout = 10 * time.Second

// errAlreadyDone ends a run of fence run-once that found its KEY done: CMD
// was not run, and fence exits 0.
var errAlreadyDone = errors.New("already done")

// runOnceLock and runOnceDoneKey are the lock that fence run-once takes for
// KEY and the fenced KV key that records KEY done.
func runOnceLock(key string) string    { return "run-once/" + key }
func runOnceDoneKey(key string) string { return "run-once/" + key + "/done" }

// runOnceArgs checks fence run-once's arguments: KEY, then --, then a
// command.
func runOnceArgs(cmd *cobra.Command, args []string) error {
	if err := dashArgs(cmd, args, "run-once", "KEY", runOnceUsage); err != nil {
		return err
	}
	if args[0] == "" {
		return fmt.Errorf("fence run-once needs a KEY that is not empty\n%s", runOnceUsage)
	}
	return nil
}

func runOnceCommand(g *globals) *cobra.Command {
	var f lockFlags
	cmd := &cobra.Command{
		Use:   "run-once [flags] KEY -- CMD [ARGS...]",
		Short: "Run a command once for KEY, whichever machine runs it first",
		Long: `Runs CMD unless KEY is recorded done, and records KEY done when CMD
succeeds: a cron job on every machine runs on one of them, once per period.
It holds the lock run-once/KEY while it checks, runs CMD (with FENCE_LOCK,
FENCE_TOKEN and FENCE_SESSION in its environment, as fence lock gives them)
and records the fenced KV key run-once/KEY/done, written with the lock's
token in strict mode: only the lock's current holder can record it. A run
that finds KEY done does not run CMD; one that fails leaves KEY open, and
the next run runs CMD.

KEY names one run, so put the period in it: nightly-$(date +%F) runs once
a day (write \% in a crontab), weekly-$(date +%G-W%V) once a week; a KEY
without a period runs once ever. Machines must agree on the period: use
date -u if their time zones differ.

Runs started meanwhile wait for the lock, then find KEY done and skip; with
--try they give up at once, with --timeout after that long.

If the lock may be lost while CMD runs (fence run-once was paused past
--ttl, say), CMD is stopped as fence lock stops it and KEY is not recorded:
the next holder may already be running CMD, and a run is duplicated. A
holder that lost the lock cannot record KEY done, as the service refuses
its write. For a job whose second run does damage, record the run in the
job's own transaction instead (nolock.Once).

CMD is looked up before any lock is taken: a command that cannot be run
is refused at once.

A record stays until it is deleted, under the lock: "fence lock
run-once/KEY -- fence kv del run-once/KEY/done" lets KEY run again. With
auth on, fence run-once needs lock write on run-once/KEY and kv write on
run-once/KEY/done.

Exit status: 0 if CMD succeeded and KEY is recorded done, or if KEY was
already done and CMD did not run (stderr says which); CMD's own if it
failed (KEY stays open); 75 if the lock was lost while CMD ran or before
KEY was recorded (KEY stays open); 124 if the lock was not granted within
--timeout, or at once with --try; 126/127 if CMD cannot be run; 128+N if
signal N stopped the wait; 1 on other errors.`,
		Args: runOnceArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			r := &runOnce{g: g, key: args[0], argv: args[1:]}
			return r.run(cmd.Context(), f)
		},
	}
	f.register(cmd)
	return cmd
}

// runOnce is one run of fence run-once.
type runOnce struct {
	g    *globals
	key  string
	argv []string
	// started is set once the lock is held and KEY found open, before CMD
	// starts; ended once CMD has exited by itself; recorded once KEY is
	// recorded done.
	started, ended, recorded bool
}

// run runs CMD under the lock as fence lock does (which refuses a CMD
// that cannot run before it takes the lock), with hooks that skip a KEY
// that is done and record one that CMD did.
func (r *runOnce) run(ctx context.Context, f lockFlags) error {
	err := runHolding(ctx, r.g, f, runOnceLock(r.key), r.argv, lockHooks{command: "fence run-once", held: r.skipIfDone, ended: r.recordDone})
	switch {
	case errors.Is(err, errAlreadyDone):
		return nil
	case !r.started || r.ended:
		return err // not run, or said by recordDone
	}
	// fence stopped CMD: the lock may be lost, or fence was told to stop.
	fmt.Fprintf(r.g.stderr, "fence run-once: %s is not recorded done; the next run runs %s again\n", r.key, r.argv[0])
	if err == nil {
		return &ExitError{Code: exitFailure} // CMD exited 0 once told to stop: not a finished run
	}
	return err
}

// skipIfDone is the held hook: it reads KEY's record under the lock and
// ends the run with errAlreadyDone if KEY is done.
func (r *runOnce) skipIfDone(ctx context.Context, c *client.Client, grant *client.Grant) error {
	if r.g.commandTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.g.commandTimeout)
		defer cancel()
	}
	done, err := c.KV().Get(ctx, runOnceDoneKey(r.key))
	if err != nil {
		return fmt.Errorf("reading %s: %w", runOnceDoneKey(r.key), err)
	}
	if done != nil {
		fmt.Fprintf(r.g.stderr, "fence run-once: %s is already done (%s; token %d): not running %s\n", r.key, done.GetValue(), done.GetToken(), r.argv[0])
		return errAlreadyDone
	}
	r.started = true
	return nil
}

// recordDone is the ended hook: when CMD succeeded, it records KEY done,
// fenced by the grant in strict mode, so that a holder that lost the lock
// records nothing.
func (r *runOnce) recordDone(ctx context.Context, c *client.Client, grant *client.Grant, exit error) error {
	r.ended = true
	if exit != nil {
		fmt.Fprintf(r.g.stderr, "fence run-once: %s failed (%v); %s is not recorded done, the next run runs %[1]s again\n", r.argv[0], exit, r.key)
		return exit
	}
	host, _ := os.Hostname()
	value := fmt.Sprintf("ran on %s, pid %d, finished %s", host, os.Getpid(), time.Now().UTC().Format(time.RFC3339))
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runOnceRecordTimeout)
	defer cancel()
	_, err := c.KV().Put(ctx, runOnceDoneKey(r.key), []byte(value), client.WithGrant(grant), client.Strict())
	switch {
	case errors.Is(err, fence.ErrNotHolder) || errors.Is(err, fence.ErrStaleToken):
		return &ExitError{Code: exitLockLost, Err: fmt.Errorf("%s succeeded, but recording %s done was refused, as lock %q (token %d) was lost: %w; the next run runs %s again",
			r.argv[0], r.key, runOnceLock(r.key), grant.Token(), err, r.argv[0])}
	case err != nil:
		done := runOnceDoneKey(r.key)
		return fmt.Errorf("%s succeeded, but recording %s done failed: %w; unless %s exists (fence kv get %s), the next run runs %s again",
			r.argv[0], r.key, err, done, done, r.argv[0])
	}
	r.recorded = true
	fmt.Fprintf(r.g.stderr, "fence run-once: %s succeeded; %s is recorded done (token %d)\n", r.argv[0], r.key, grant.Token())
	return nil
}

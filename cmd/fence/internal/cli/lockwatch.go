package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

// lockWatchHelp is what fence locks --help says of --watch.
const lockWatchHelp = `With --watch, prints what happens to the locks under the prefix, one line
an event, until interrupted: what happened (granted, released, expired,
revoked, abandoned, queued, gave up, delay started, delay ended) and the
lock, then tab-separated the event's revision, the grant's token, the
session and more: "granted LOCK<tab>rev N<tab>token T<tab>session S (OWNER)".
A watch that loses its node goes on at the leader without missing an
event; --from-revision N first prints the events from revision N on that
the leader still keeps, to resume an earlier watch after its last
revision. With --json, prints each event as the API's LockEvent, one JSON
object a line.`

// withLockWatch adds --watch and --from-revision to fence locks (cmd):
// with --watch it prints the lock events under the prefix (--prefix, or
// the PREFIX argument where the command takes one) until interrupted,
// instead of listing the locks.
func withLockWatch(g *globals, cmd *cobra.Command) *cobra.Command {
	var watch bool
	var from uint64
	list := cmd.RunE
	cmd.Flags().BoolVar(&watch, "watch", false, "print each lock event under the prefix as it happens, until interrupted")
	cmd.Flags().Uint64Var(&from, "from-revision", 0, "with --watch: first print the events from this revision on (resume a watch after its last revision)")
	if cmd.Long == "" {
		cmd.Long = cmd.Short + "."
	}
	cmd.Long += "\n\n" + lockWatchHelp
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if !watch {
			if cmd.Flags().Changed("from-revision") {
				return fmt.Errorf("--from-revision goes with --watch")
			}
			return list(cmd, args)
		}
		for _, flag := range []string{"limit", "stale"} {
			if cmd.Flags().Changed(flag) {
				return fmt.Errorf("--%s does not go with --watch: a watch follows the leader, every event", flag)
			}
		}
		prefix, err := locksPrefix(cmd, args)
		if err != nil {
			return err
		}
		asJSON, _ := cmd.Flags().GetBool("json")
		return g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			return watchLocks(cmd.Context(), g.stdout, c, prefix, from, asJSON)
		})(cmd, args)
	}
	return cmd
}

// runsUntilInterrupted reports whether a command that answers at once
// was asked to go on until interrupted (--hold, --watch), so that
// --command-timeout does not bound it.
func runsUntilInterrupted(cmd *cobra.Command) bool {
	hold, _ := cmd.Flags().GetBool("hold")
	watch, _ := cmd.Flags().GetBool("watch")
	return hold || watch
}

// watchLocks prints the lock events under prefix from revision from (0:
// from now) until ctx ends.
func watchLocks(ctx context.Context, out io.Writer, c *client.Client, prefix string, from uint64, asJSON bool) error {
	w, err := c.WatchLocks(ctx, prefix, from)
	if err != nil {
		return err
	}
	defer w.Close()
	for ev := range w.Events() {
		line := lockEventText(ev)
		if asJSON {
			if line, err = lockEventJSON(ev); err != nil {
				return err
			}
		}
		if _, err := fmt.Fprintln(out, line); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil // interrupted
	}
	return fmt.Errorf("watching the locks ended: %w", w.Err())
}

// lockEventJSON is ev as the API's JSON, on one line.
func lockEventJSON(ev *client.LockEvent) (string, error) {
	data, err := rawJSON(ev)
	if err != nil {
		return "", err
	}
	var line bytes.Buffer
	if err := json.Compact(&line, data); err != nil {
		return "", err
	}
	return line.String(), nil
}

// lockEventText is ev as a person reads it, one line in fields as fence kv
// watch prints a change: "granted LOCK<tab>rev N<tab>token T<tab>session S
// (OWNER)", "gave up LOCK<tab>rev N<tab>session S<tab>timed out"; the
// token is that of the grant the event is about, and the last field, if
// any, says more (a mode, why a wait ended, a lock-delay's length).
func lockEventText(ev *client.LockEvent) string {
	kind := enumWord(ev.GetType().String(), "LOCK_EVENT_TYPE_")
	fields := []string{kind + " " + ev.GetLock(), fmt.Sprintf("rev %d", ev.GetRevision())}
	if t := ev.GetToken(); t != 0 {
		fields = append(fields, fmt.Sprintf("token %d", t))
	}
	if id := ev.GetSessionId(); id != 0 {
		who := fmt.Sprintf("session %d", id)
		if o := ev.GetOwner(); o != "" {
			who += fmt.Sprintf(" (%s)", o)
		}
		fields = append(fields, who)
	}
	if more := lockEventMore(ev); more != "" {
		fields = append(fields, more)
	}
	return strings.Join(fields, "\t")
}

// lockEventMore is the last field of an event's line: a grant's or a
// wait's mode other than exclusive, how the holder's own session ended its
// grant, why a wait ended, a lock-delay's length.
func lockEventMore(ev *client.LockEvent) string {
	switch ev.GetType() {
	case fencev1.LockEventType_LOCK_EVENT_TYPE_GRANTED, fencev1.LockEventType_LOCK_EVENT_TYPE_QUEUED:
		switch ev.GetMode() {
		case fencev1.Mode_MODE_SHARED:
			return "shared"
		case fencev1.Mode_MODE_SEMAPHORE:
			return fmt.Sprintf("semaphore of %d", ev.GetPermits())
		}
	case fencev1.LockEventType_LOCK_EVENT_TYPE_RELEASED:
		if ev.GetSessionEnd() == fencev1.SessionEnd_SESSION_END_CLOSED {
			return "session closed"
		}
	case fencev1.LockEventType_LOCK_EVENT_TYPE_GAVE_UP:
		if ev.GetReason() == fencev1.GiveUpReason_GIVE_UP_REASON_SESSION_ENDED {
			return "session " + enumWord(ev.GetSessionEnd().String(), "SESSION_END_")
		}
		return enumWord(ev.GetReason().String(), "GIVE_UP_REASON_")
	case fencev1.LockEventType_LOCK_EVENT_TYPE_DELAY_STARTED:
		return ev.GetLockDelay().AsDuration().String()
	}
	return ""
}

// enumWord is an enum value's name without its prefix, in lower case
// with spaces: "timed out" for GIVE_UP_REASON_TIMED_OUT.
func enumWord(name, prefix string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(name, prefix)), "_", " ")
}

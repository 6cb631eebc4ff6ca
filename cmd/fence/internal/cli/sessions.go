package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

func sessionsCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "sessions",
		Short: "List sessions, and revoke one to release its locks (force-unlock)",
	}
	cmd.AddCommand(sessionsListCommand(g), sessionsRevokeCommand(g))
	return cmd
}

func sessionsListCommand(g *globals) *cobra.Command {
	var asJSON bool
	var rf readFlags
	cmd := &cobra.Command{
		Use:         "list",
		Annotations: bounded,
		Short:       "List sessions: id, owner, TTL, time left, locks held",
		Long: `Lists every session with its owner, TTL, how long it lives without a
keepalive (EXPIRES, on the leader's clock; "-" from --stale), and the locks
it holds with their tokens.`,
		Args: cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			sessions, err := c.Sessions(cmd.Context(), rf.options()...)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, &fencev1.ListSessionsResponse{Sessions: sessions})
			}
			return printTable(g, "SESSION\tTTL\tEXPIRES\tLOCKS\tOWNER", sessions, func(s *fencev1.SessionInfo) string {
				expires := "-"
				if s.GetExpiresIn() != nil {
					expires = s.GetExpiresIn().AsDuration().Round(time.Millisecond).String()
				}
				return fmt.Sprintf("%d\t%s\t%s\t%s\t%s", s.GetSessionId(), s.GetTtl().AsDuration(), expires, heldLocks(s), s.GetOwner())
			})
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's ListSessionsResponse")
	rf.register(cmd)
	return cmd
}

// heldLocks is "orders(33),jobs(35)", or "-" for none.
func heldLocks(s *client.SessionInfo) string {
	var held []string
	for _, h := range s.GetHeld() {
		held = append(held, fmt.Sprintf("%s(%d)", h.GetLock(), h.GetToken()))
	}
	if len(held) == 0 {
		return "-"
	}
	return strings.Join(held, ",")
}

// releasedLocks lists the locks that revoking s released, each said to be
// held back by its lock-delay where it is: the next waiter gets such a lock
// only once the delay has passed.
func releasedLocks(ctx context.Context, c *client.Client, s *client.SessionInfo) string {
	var released []string
	for _, h := range s.GetHeld() {
		desc := fmt.Sprintf("%s(%d)", h.GetLock(), h.GetToken())
		if locks, err := c.Locks(ctx, h.GetLock()); err == nil {
			for _, l := range locks {
				if l.GetName() == h.GetLock() && l.GetDelayed() {
					desc += " (held back by its lock-delay)"
				}
			}
		}
		released = append(released, desc)
	}
	if len(released) == 0 {
		return "-"
	}
	return strings.Join(released, ", ")
}

func sessionsRevokeCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:         "revoke SESSION...",
		Annotations: bounded,
		Short:       "Close sessions, releasing every lock they hold (force-unlock)",
		Long: `Closes each SESSION (an id from "fence sessions list") as if it had
expired: its locks go to their next waiters (a lock taken with a lock-delay
once that delay has passed, as the holder may still be writing), its waits
and bound keys are dropped, in one commit. Its holder finds out at its next
keepalive; a "fence lock" holding one of its locks stops its command (exit
75). Like etcdctl lease revoke and consul session destroy. Exit 1 if a
SESSION does not exist; the others are still revoked.`,
		Args: cobra.MinimumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			var ids []uint64 // each once, in the order given
			for _, a := range args {
				id, err := strconv.ParseUint(a, 10, 64)
				if err != nil || id == 0 {
					return fmt.Errorf("%q is not a session id (a decimal number from 1 up, as fence sessions list shows)", a)
				}
				if !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
			sessions, err := c.Sessions(cmd.Context())
			if err != nil {
				return err
			}
			known := map[uint64]*client.SessionInfo{}
			for _, s := range sessions {
				known[s.GetSessionId()] = s
			}
			var missing []string
			for _, id := range ids {
				s, ok := known[id]
				if !ok {
					missing = append(missing, strconv.FormatUint(id, 10))
					continue
				}
				if err := c.RevokeSession(cmd.Context(), id); err != nil {
					return fmt.Errorf("revoking session %d: %w", id, err)
				}
				fmt.Fprintf(g.stdout, "revoked session %d (%s), released %s\n", id, orDash(s.GetOwner()), releasedLocks(cmd.Context(), c, s))
			}
			if len(missing) > 0 {
				return &ExitError{Code: exitFailure, Err: fmt.Errorf("no session %s", strings.Join(missing, ", "))}
			}
			return nil
		}),
	}
}

package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/client"
)

func electCommand(g *globals) *cobra.Command {
	var ttl time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "elect NAME VALUE",
		Short: "Campaign to lead NAME with VALUE, and hold leadership until interrupted",
		Long: `Waits until elected, prints the leadership's fencing token, and leads until
interrupted (then resigns, exit 0) or until the session may be lost (exit 75).
"fence leader NAME" prints the current leader. With --json, the line once
elected is {"name", "elected", "value", "token"}, as fence leader --json
prints it.`,
		Args: cobra.ExactArgs(2),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			ctx := cmd.Context()
			s, err := c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner("fence elect "+args[1]))
			if err != nil {
				return err
			}
			defer s.Close(context.Background())
			e := client.NewElection(s, args[0])
			l, err := e.Campaign(ctx, args[1])
			if err != nil {
				return err
			}
			if asJSON {
				err = printLeader(g, args[0], client.LeaderState{Elected: true, Value: args[1], Token: l.Token()}, true, false)
			} else {
				_, err = fmt.Fprintf(g.stdout, "elected leader of %s as %q with token %d\n", args[0], args[1], l.Token())
			}
			if err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				resignCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return e.Resign(resignCtx)
			case <-l.Done():
				return &ExitError{Code: exitLockLost, Err: fmt.Errorf("leadership of %s may be lost: %v", args[0], l.Err())}
			}
		}),
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 10*time.Second, "session TTL")
	cmd.Flags().BoolVar(&asJSON, "json", false, `once elected, print JSON: {"name", "elected", "value", "token"} on one line`)
	return cmd
}

func leaderCommand(g *globals) *cobra.Command {
	var watch, asJSON bool
	cmd := &cobra.Command{
		Use:   "leader NAME",
		Short: "Print the current leader of NAME and its token (exit 1 if none)",
		Long: `Prints the current leader of the election NAME and its token, or exits 1
if nobody leads. With --watch, prints the state, then every change (a new
leader, a new value, "no leader") until interrupted.

With --json, prints {"name", "elected", "value", "token"}; with --watch,
one such object a line.`,
		Args: cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			if watch {
				return watchLeader(cmd.Context(), g, c, args[0], asJSON)
			}
			st, err := c.Leader(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if err := printLeader(g, args[0], st, asJSON, true); err != nil {
				return err
			}
			if !st.Elected {
				return &ExitError{Code: exitFailure, Err: fmt.Errorf("%s has no leader", args[0])}
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&watch, "watch", false, "print every change of leader until interrupted")
	cmd.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"name", "elected", "value", "token"}, one object a line with --watch`)
	return cmd
}

// leaderJSON is the --json form of an election's state.
type leaderJSON struct {
	Name    string `json:"name"`
	Elected bool   `json:"elected"`
	Value   string `json:"value"`
	Token   string `json:"token"`
}

// printLeader prints the election's state: as JSON, indented or one a
// line; or as "VALUE<tab>token N", and nothing when nobody leads unless
// watching ("(no leader)").
func printLeader(g *globals, name string, st client.LeaderState, asJSON, indent bool) error {
	if asJSON {
		v := leaderJSON{Name: name, Elected: st.Elected, Value: st.Value, Token: jsonUint(st.Token)}
		if indent {
			return printJSONValue(g, v)
		}
		data, err := json.Marshal(v)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(g.stdout, string(data))
		return err
	}
	if st.Elected {
		_, err := fmt.Fprintf(g.stdout, "%s\ttoken %d\n", st.Value, st.Token)
		return err
	}
	if !indent {
		_, err := fmt.Fprintln(g.stdout, "(no leader)")
		return err
	}
	return nil
}

// watchLeader prints the election's state and its changes until ctx ends.
func watchLeader(ctx context.Context, g *globals, c *client.Client, name string, asJSON bool) error {
	states, err := c.ObserveLeader(ctx, name)
	if err != nil {
		return err
	}
	for st := range states {
		if err := printLeader(g, name, st, asJSON, false); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil // interrupted
	}
	return fmt.Errorf("watching %s ended; run again to go on", name)
}

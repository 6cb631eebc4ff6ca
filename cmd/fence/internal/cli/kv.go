package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

type fenceFlags struct {
	lock     string
	token    string
	strict   bool
	revision int64
}

func (f *fenceFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.lock, "lock", os.Getenv("FENCE_LOCK"), "lock the token was granted under (default $FENCE_LOCK)")
	fl.StringVar(&f.token, "token", os.Getenv("FENCE_TOKEN"), "fencing token of the write (default $FENCE_TOKEN)")
	fl.BoolVar(&f.strict, "strict", false, "the token must be the lock's current grant")
	fl.Int64Var(&f.revision, "if-revision", -1, "write only if the key is at this revision (0: only if absent)")
}

// withClient is g.withClient for a command that writes fenced by f: it
// reads the fencing flags first, so that a mistake in them is reported
// before anything connects, and passes fn their write options.
func (f *fenceFlags) withClient(g *globals, fn func(cmd *cobra.Command, args []string, c *client.Client, opts []client.WriteOption) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		opts, err := f.options()
		if err != nil {
			return err
		}
		return g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			return fn(cmd, args, c, opts)
		})(cmd, args)
	}
}

// options are the write options of the flags. A fence that the service
// would refuse is refused here, naming the flags rather than the API's
// fields (fence.lock, fence.token).
func (f *fenceFlags) options() ([]client.WriteOption, error) {
	switch {
	case f.strict && (f.lock == "" || f.token == ""):
		return nil, fmt.Errorf("--strict needs --lock and --token: the lock and its current grant's token (under fence lock, FENCE_LOCK and FENCE_TOKEN give them)")
	case f.token != "" && f.lock == "":
		return nil, fmt.Errorf("--token %s needs --lock: the lock the token was granted under (under fence lock, FENCE_LOCK gives it)", f.token)
	case f.lock != "" && f.token == "":
		return nil, fmt.Errorf("--lock %s needs --token: the token of the grant that fences the write (under fence lock, FENCE_TOKEN gives it); without either the write is not fenced", f.lock)
	}
	var opts []client.WriteOption
	if f.token != "" {
		token, err := strconv.ParseUint(f.token, 10, 64)
		if err != nil || token == 0 {
			return nil, fmt.Errorf("--token %q is not a fencing token (a decimal number from 1 up)", f.token)
		}
		opts = append(opts, client.FencedBy(f.lock, token))
	}
	if f.strict {
		opts = append(opts, client.Strict())
	}
	if f.revision >= 0 {
		opts = append(opts, client.IfRevision(uint64(f.revision)))
	}
	return opts, nil
}

// readFlags are the flags of a command that reads the service's state:
// --stale.
type readFlags struct{ stale bool }

func (f *readFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.stale, "stale", false, "read from the node's own state, without the leader (may be behind)")
}

// options are the read options of the flags.
func (f *readFlags) options() []client.ReadOption {
	if f.stale {
		return []client.ReadOption{client.Stale()}
	}
	return nil
}

func kvCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kv",
		Short: "Read and write the service's fenced key-value store",
		Long: `The fenced KV store refuses a write whose token is lower than one the key
has already accepted. Under "fence lock", --lock and --token default to the
lock's FENCE_LOCK and FENCE_TOKEN, so "fence lock L -- fence kv put k v" is fenced.`,
	}
	cmd.AddCommand(kvPutCommand(g), kvGetCommand(g), kvDelCommand(g), kvListCommand(g), kvWatchCommand(g), kvTxnCommand(g))
	return cmd
}

func kvPutCommand(g *globals) *cobra.Command {
	var (
		f      fenceFlags
		hold   bool
		asJSON bool
		ttl    time.Duration
	)
	cmd := &cobra.Command{
		Use:         "put KEY VALUE",
		Annotations: bounded,
		Short:       "Write a value, fenced by --lock/--token",
		Long: `Writes VALUE under KEY, fenced by --lock/--token when given.

With --hold, the key is bound to a session of this process and the command
stays running: the key is deleted when it is interrupted (exit 0) or when
its session ends, for example because the process was paused or killed
(exit 75 if it notices). Registrations and presence, like an etcd lease key
or a ZooKeeper ephemeral node.`,
		Args: cobra.ExactArgs(2),
		RunE: f.withClient(g, func(cmd *cobra.Command, args []string, c *client.Client, opts []client.WriteOption) error {
			ctx := cmd.Context()
			var s *client.Session
			if hold {
				var err error
				s, err = c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner("fence kv put --hold "+args[0]))
				if err != nil {
					return err
				}
				defer s.Close(context.Background())
				opts = append(opts, client.BoundTo(s))
			}
			rev, err := c.KV().Put(ctx, args[0], []byte(args[1]), opts...)
			if hold && ctx.Err() != nil {
				return nil // interrupted: the deferred Close deletes the key if the put landed
			}
			if err != nil {
				return err
			}
			if asJSON {
				err = printJSON(g, &fencev1.PutResponse{Revision: rev})
			} else {
				_, err = fmt.Fprintf(g.stdout, "revision %d\n", rev)
			}
			if err != nil || !hold {
				return err
			}
			select {
			case <-ctx.Done():
				return nil // the deferred Close deletes the key
			case <-s.Done():
				return &ExitError{Code: exitLockLost, Err: fmt.Errorf("the session holding %s may be lost, and the key with it: %v", args[0], s.Err())}
			}
		}),
	}
	f.register(cmd)
	cmd.Flags().BoolVar(&hold, "hold", false, "bind the key to this process's session and keep it until interrupted")
	cmd.Flags().DurationVar(&ttl, "ttl", 10*time.Second, "with --hold: the session's TTL")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's PutResponse: the revision")
	return cmd
}

func kvDelCommand(g *globals) *cobra.Command {
	var f fenceFlags
	cmd := &cobra.Command{
		Use:         "del KEY",
		Annotations: bounded,
		Short:       "Delete a key, fenced by --lock/--token",
		Long: `Deletes KEY, fenced by --lock/--token when given, and prints "deleted KEY",
or "KEY did not exist" when there was nothing to delete (exit 0 either way).`,
		Args: cobra.ExactArgs(1),
		RunE: f.withClient(g, func(cmd *cobra.Command, args []string, c *client.Client, opts []client.WriteOption) error {
			deleted, err := c.KV().Delete(cmd.Context(), args[0], opts...)
			if err != nil {
				return err
			}
			if !deleted {
				_, err = fmt.Fprintf(g.stdout, "%s did not exist\n", args[0])
				return err
			}
			_, err = fmt.Fprintf(g.stdout, "deleted %s\n", args[0])
			return err
		}),
	}
	f.register(cmd)
	return cmd
}

func kvGetCommand(g *globals) *cobra.Command {
	var asJSON bool
	var rf readFlags
	cmd := &cobra.Command{
		Use:         "get KEY",
		Annotations: bounded,
		Short:       "Print a key's value (exit 1 if it does not exist)",
		Args:        cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			kv, err := c.KV().Get(cmd.Context(), args[0], rf.options()...)
			if err != nil {
				return err
			}
			if kv == nil {
				return &ExitError{Code: exitFailure, Err: fmt.Errorf("key %s does not exist", args[0])}
			}
			if asJSON {
				return printJSON(g, kv)
			}
			_, err = fmt.Fprintf(g.stdout, "%s\n", kv.GetValue())
			return err
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's KeyValue: the key with its token and revisions")
	rf.register(cmd)
	return cmd
}

func kvListCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:         "list [PREFIX]",
		Annotations: bounded,
		Short:       "List keys with their tokens and revisions",
		Long: `Lists the keys under PREFIX, one line each: "KEY<tab>rev N<tab>token T<tab>VALUE",
VALUE as it is when it is UTF-8 text on one line, and quoted as Go quotes a
string otherwise ("\xff\n").`,
		Args: cobra.MaximumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			l, err := c.KV().List(cmd.Context(), prefix)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, &fencev1.ListResponse{Kvs: l.KVs, More: l.More, Revision: l.Revision})
			}
			for _, kv := range l.KVs {
				fmt.Fprintf(g.stdout, "%s\trev %d\ttoken %d\t%s\n", kv.GetKey(), kv.GetModRevision(), kv.GetToken(), valueText(kv.GetValue()))
			}
			if l.More {
				fmt.Fprintln(g.stdout, "(more keys match)")
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's ListResponse: the keys, whether more match and the store's revision")
	return cmd
}

func kvWatchCommand(g *globals) *cobra.Command {
	var from uint64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "watch [PREFIX]",
		Short: "Print changes to keys as they are committed, one line each",
		Long: `Prints each change to a key under PREFIX as it is committed, one line each:
"put KEY<tab>rev N<tab>token T<tab>VALUE" or "delete KEY<tab>rev N<tab>token T",
until interrupted. VALUE is printed as it is when it is UTF-8 text on one
line, and quoted as Go quotes a string otherwise ("\xff\n").

With --json, prints each change as the API's Event, one JSON object a line.`,
		Args: cobra.MaximumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			w, err := c.KV().Watch(cmd.Context(), prefix, client.FromRevision(from))
			if err != nil {
				return err
			}
			defer w.Close()
			for ev := range w.Events() {
				if err := printEvent(g, ev, asJSON); err != nil {
					return err
				}
			}
			if cmd.Context().Err() != nil {
				return nil // interrupted
			}
			return w.Err()
		}),
	}
	cmd.Flags().Uint64Var(&from, "from-revision", 0, "first deliver the changes already made from this revision on (resume a watch, or follow a list)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each change as the API's Event, one JSON object a line")
	return cmd
}

// printEvent prints a change to a key: as the API's JSON on one line, or
// as a line for people.
func printEvent(g *globals, ev *fencev1.Event, asJSON bool) error {
	if asJSON {
		data, err := rawJSON(ev)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(g.stdout, string(data))
		return err
	}
	kv := ev.GetKv()
	var err error
	switch ev.GetType() {
	case fencev1.EventType_EVENT_TYPE_DELETE:
		_, err = fmt.Fprintf(g.stdout, "delete %s\trev %d\ttoken %d\n", kv.GetKey(), kv.GetModRevision(), kv.GetToken())
	default:
		_, err = fmt.Fprintf(g.stdout, "put %s\trev %d\ttoken %d\t%s\n", kv.GetKey(), kv.GetModRevision(), kv.GetToken(), valueText(kv.GetValue()))
	}
	return err
}

// valueText is a value as a line of output shows it: as it is when it is
// UTF-8 text on one line, quoted as Go quotes a string otherwise, so that
// a value never breaks the line or the terminal.
func valueText(v []byte) string {
	if utf8.Valid(v) && !bytes.ContainsFunc(v, unicode.IsControl) && !bytes.HasPrefix(v, []byte(`"`)) {
		return string(v)
	}
	return strconv.Quote(string(v))
}

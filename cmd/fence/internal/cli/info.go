package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

func locksCommand(g *globals) *cobra.Command {
	var asJSON bool
	var rf readFlags
	var limit uint32
	cmd := &cobra.Command{
		Use:         "locks [PREFIX]",
		Annotations: bounded,
		Short:       "List the locks that are held or waited for",
		Long: `Lists the locks that are held, waited for or under lock-delay, one a line:
LOCK, the holders' TOKEN, how many WAITERS, and the HOLDER: its owner (as
the client named its session: fence lock names "fence lock pid N on HOST")
and session id, which fence sessions revoke takes. PREFIX (or --prefix)
lists only the locks whose name starts with it, as fence kv list PREFIX
does keys.

With --json, prints the API's ListLocksResponse.`,
		Args: cobra.MaximumNArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			prefix, err := locksPrefix(cmd, args)
			if err != nil {
				return err
			}
			locks, next, err := listLocks(cmd.Context(), c, prefix, limit, rf.options())
			if err != nil {
				return err
			}
			if next != "" {
				defer fmt.Fprintf(g.stderr, "fence: more locks follow the first %d; narrow with --prefix or raise --limit\n", limit)
			}
			if asJSON {
				return printJSON(g, &fencev1.ListLocksResponse{Locks: locks, NextPageToken: next})
			}
			return printTable(g, "LOCK\tTOKEN\tWAITERS\tHOLDER", locks, func(l *fencev1.LockInfo) string {
				name := l.GetName()
				if n := l.GetPermits(); n > 0 {
					name = fmt.Sprintf("%s (semaphore %d/%d)", name, len(l.GetHolders()), n)
				}
				return fmt.Sprintf("%s\t%s\t%d\t%s", name, holderTokens(l), len(l.GetWaiters()), holderText(l))
			})
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the API's ListLocksResponse")
	cmd.Flags().String("prefix", "", "only locks whose name starts with this (as PREFIX)")
	rf.register(cmd)
	cmd.Flags().Uint32Var(&limit, "limit", 0, "list at most this many locks (0: all, read a page at a time)")
	return cmd
}

// locksPrefix is the prefix of the locks fence locks lists or watches:
// PREFIX, which must then agree with --prefix if that is given too, or
// else --prefix.
func locksPrefix(cmd *cobra.Command, args []string) (string, error) {
	prefix, _ := cmd.Flags().GetString("prefix")
	if len(args) == 0 {
		return prefix, nil
	}
	if cmd.Flags().Changed("prefix") && prefix != args[0] {
		return "", fmt.Errorf("PREFIX %q and --prefix %q differ: give the prefix once", args[0], prefix)
	}
	return args[0], nil
}

// listLocks lists the locks under prefix: all of them, or the first limit
// and the page token of the rest ("" for none).
func listLocks(ctx context.Context, c *client.Client, prefix string, limit uint32, opts []client.ReadOption) ([]*client.LockInfo, string, error) {
	if limit == 0 {
		locks, err := c.Locks(ctx, prefix, opts...)
		return locks, "", err
	}
	return c.LocksPage(ctx, prefix, "", limit, opts...)
}

// holderTokens is the tokens of a lock's holders, "3" or "3,5", or "-".
func holderTokens(l *client.LockInfo) string {
	var ts []string
	for _, h := range l.GetHolders() {
		ts = append(ts, fmt.Sprint(h.GetToken()))
	}
	if len(ts) == 0 {
		return "-"
	}
	return strings.Join(ts, ",")
}

// holderText is who holds a lock, as a person finds them: each holder's
// owner with its session ("fence lock pid 7 on db1 (session 4)", the
// session alone when it has no owner), "(lock-delay)" for a lock kept from
// everyone after its holder's session ended, or "-".
func holderText(l *client.LockInfo) string {
	if l.GetDelayed() {
		return "(lock-delay)"
	}
	var hs []string
	for _, h := range l.GetHolders() {
		if owner := h.GetOwner(); owner != "" {
			hs = append(hs, fmt.Sprintf("%s (session %d)", owner, h.GetSessionId()))
		} else {
			hs = append(hs, fmt.Sprintf("session %d", h.GetSessionId()))
		}
	}
	if len(hs) == 0 {
		return "-"
	}
	return strings.Join(hs, "; ")
}

func statusCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:         "status",
		Annotations: bounded,
		Short:       "Show the raft group: members, leader, terms, indexes, each node's health",
		Args:        cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			nodes := nodeStatuses(cmd.Context(), c, st)
			if asJSON {
				return printStatusJSON(g, st, nodes)
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "cluster\t%s\n", orDash(st.GetClusterId()))
			fmt.Fprintf(w, "leader\t%s %s\n", orDash(st.GetLeaderId()), leaderAPI(st))
			fmt.Fprintf(w, "last token\t%d\n", st.GetLastToken())
			fmt.Fprintf(w, "sessions\t%d\n", st.GetSessions())
			fmt.Fprintf(w, "locks\t%d\n", st.GetLocks())
			fmt.Fprintf(w, "version\t%s\n", st.GetVersion())
			fmt.Fprintf(w, "protocol\t%d\n", st.GetProtocol())
			w.Flush()
			fmt.Fprintln(g.stdout)
			return printTable(g, "NODE\tAPI\tRAFT\tSTATE\tTERM\tLAST\tCOMMIT\tAPPLIED\tVERSION\tHEALTH", nodes, nodeStatus.row)
		}),
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print the API's StatusResponse of the node that answered, with "nodes": [{"id", "api", "health", "status": each node's own StatusResponse}]`)
	return cmd
}

type nodeStatus struct {
	id, api, raft string
	status        *fencev1.StatusResponse
	err           error
}

// row is the node's line in fence status's table of nodes.
func (n nodeStatus) row() string {
	if n.err != nil {
		return fmt.Sprintf("%s\t%s\t%s\t-\t-\t-\t-\t-\t-\tunreachable: %v", n.id, orDash(n.api), n.raft, n.err)
	}
	s := n.status
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s", s.GetNodeId(), orDash(n.api), n.raft, s.GetState(), s.GetTerm(), s.GetLastIndex(), s.GetCommitIndex(), s.GetAppliedIndex(), orDash(s.GetVersion()), n.health())
}

// health is "ok", the node's own problems, or why it could not be asked.
func (n nodeStatus) health() string {
	switch {
	case n.err != nil:
		return n.err.Error()
	case len(n.status.GetProblems()) > 0:
		return strings.Join(n.status.GetProblems(), "; ")
	}
	return "ok"
}

// nodeStatuses asks every member whose API address is known, and every
// configured endpoint, for its own view.
func nodeStatuses(ctx context.Context, c *client.Client, st *fencev1.StatusResponse) []nodeStatus {
	var out []nodeStatus
	seen := map[string]bool{}
	for _, m := range st.GetMembers() {
		n := nodeStatus{id: m.GetId(), api: m.GetApiAddress(), raft: m.GetRaftAddress()}
		if n.api == "" {
			n.err = fmt.Errorf("API address not known yet (registered when it leads)")
		} else {
			seen[hostPort(n.api)] = true
		}
		out = append(out, n)
	}
	for _, ep := range c.Endpoints() {
		addr := hostPort(ep)
		if seen[addr] {
			continue
		}
		seen[addr] = true
		out = append(out, nodeStatus{id: "?", api: addr})
	}
	for i := range out {
		if out[i].api == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		out[i].status, out[i].err = c.StatusOf(ctx, out[i].api)
		cancel()
		if out[i].status != nil {
			out[i].id = out[i].status.GetNodeId()
		}
	}
	return dedupeByID(out)
}

// dedupeByID keeps one row a node: an endpoint spelled otherwise than the
// node's advertised address ("localhost:7000" for "127.0.0.1:7000") reaches
// a member already listed. The member's row stays, unless only the other
// spelling reached the node; rows of no known id (an endpoint that did not
// answer) all stay.
func dedupeByID(nodes []nodeStatus) []nodeStatus {
	var out []nodeStatus
	row := map[string]int{}
	for _, n := range nodes {
		i, seen := row[n.id]
		switch {
		case n.status == nil && (n.id == "?" || n.id == ""):
			out = append(out, n)
		case !seen:
			row[n.id] = len(out)
			out = append(out, n)
		case out[i].err != nil && n.err == nil:
			n.raft = cmp.Or(out[i].raft, n.raft)
			out[i] = n
		}
	}
	return out
}

// leaderAPI is the leader's API address, once it has registered it.
func leaderAPI(st *fencev1.StatusResponse) string {
	if a := st.GetLeaderAddress(); a != "" {
		return a
	}
	for _, m := range st.GetMembers() {
		if m.GetId() == st.GetLeaderId() {
			return m.GetApiAddress()
		}
	}
	return ""
}

// printStatusJSON prints the Status of the node that answered, with a
// "nodes" list of every node's own status and health.
func printStatusJSON(g *globals, st *fencev1.StatusResponse, nodes []nodeStatus) error {
	leader, err := rawJSON(st)
	if err != nil {
		return err
	}
	type nodeJSON struct {
		ID     string          `json:"id"`
		API    string          `json:"api,omitempty"`
		Health string          `json:"health"`
		Status json.RawMessage `json:"status,omitempty"`
	}
	var list []nodeJSON
	for _, n := range nodes {
		nj := nodeJSON{ID: n.id, API: n.api, Health: n.health()}
		if n.err == nil {
			if data, err := rawJSON(n.status); err == nil {
				nj.Status = data
			}
		}
		list = append(list, nj)
	}
	// The answering node's status, as the API gives it, plus every node's.
	var out map[string]any
	if err := json.Unmarshal(leader, &out); err != nil {
		return err
	}
	out["nodes"] = list
	return printJSONValue(g, out)
}

// hostPort strips the scheme of an endpoint URL.
func hostPort(endpoint string) string {
	for _, scheme := range []string{"http://", "https://"} {
		endpoint = strings.TrimPrefix(endpoint, scheme)
	}
	return endpoint
}

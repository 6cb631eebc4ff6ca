package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

func printJSON(g *globals, m proto.Message) error {
	data, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(g.stdout, string(data))
	return err
}

func locksCommand(g *globals) *cobra.Command {
	var asJSON bool
	var prefix string
	cmd := &cobra.Command{
		Use:   "locks",
		Short: "List the locks that are held or waited for",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			locks, err := c.Locks(cmd.Context(), prefix)
			if err != nil {
				return err
			}
			if asJSON {
				list := make([]json.RawMessage, 0, len(locks))
				for _, l := range locks {
					data, err := protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(l)
					if err != nil {
						return err
					}
					list = append(list, data)
				}
				data, err := json.MarshalIndent(map[string]any{"locks": list}, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintln(g.stdout, string(data))
				return err
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "LOCK\tHOLDER\tTOKEN\tWAITERS\tOWNER")
			for _, l := range locks {
				holder, token, owner := "-", "-", ""
				var hs, ts, owners []string
				for _, h := range l.GetHolders() {
					hs = append(hs, fmt.Sprint(h.GetSessionId()))
					ts = append(ts, fmt.Sprint(h.GetToken()))
					owners = append(owners, h.GetOwner())
				}
				if len(hs) > 0 {
					holder, token, owner = strings.Join(hs, ","), strings.Join(ts, ","), strings.Join(owners, "; ")
				}
				if l.GetDelayed() {
					holder = "(lock-delay)"
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\n", l.GetName(), holder, token, len(l.GetWaiters()), owner)
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.Flags().StringVar(&prefix, "prefix", "", "only locks whose name starts with this")
	return cmd
}

func statusCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the node, its raft group and the replicated state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(g, st)
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "node\t%s (%s)\n", st.GetNodeId(), st.GetState())
			fmt.Fprintf(w, "leader\t%s %s\n", st.GetLeaderId(), st.GetLeaderAddress())
			fmt.Fprintf(w, "term\t%d\n", st.GetTerm())
			fmt.Fprintf(w, "index\tlast %d, commit %d, applied %d\n", st.GetLastIndex(), st.GetCommitIndex(), st.GetAppliedIndex())
			fmt.Fprintf(w, "last token\t%d\n", st.GetLastToken())
			fmt.Fprintf(w, "sessions\t%d\n", st.GetSessions())
			fmt.Fprintf(w, "locks\t%d\n", st.GetLocks())
			for _, m := range st.GetMembers() {
				role := "voter"
				if !m.GetVoter() {
					role = "nonvoter"
				}
				fmt.Fprintf(w, "member\t%s %s %s\n", m.GetId(), m.GetRaftAddress(), role)
			}
			fmt.Fprintf(w, "version\t%s\n", st.GetVersion())
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
)

func membersCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "members",
		Short: "List, add and remove the members of the raft group",
	}
	var asJSON bool
	list := &cobra.Command{
		Use:         "list",
		Annotations: bounded,
		Short:       "List the members with their raft and API addresses",
		Args:        cobra.NoArgs,
		RunE: g.withClient(func(cmd *cobra.Command, _ []string, c *client.Client) error {
			st, err := c.Status(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printMembersJSON(g, st)
			}
			return printTable(g, "ID\tRAFT\tAPI\tROLE", st.GetMembers(), func(m *fencev1.Member) string {
				role := "voter"
				if !m.GetVoter() {
					role = "nonvoter"
				}
				if m.GetId() == st.GetLeaderId() {
					role += ", leader"
				}
				return fmt.Sprintf("%s\t%s\t%s\t%s", m.GetId(), m.GetRaftAddress(), orDash(m.GetApiAddress()), role)
			})
		}),
	}
	list.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"leaderId", "members": [the API's Member]}`)
	cmd.AddCommand(list)
	var nonvoter bool
	add := &cobra.Command{
		Use:         "add ID RAFT-ADDRESS",
		Annotations: bounded,
		Short:       "Add a node started with --join",
		Args:        cobra.ExactArgs(2),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			if err := c.AddMember(cmd.Context(), args[0], args[1], !nonvoter); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "added %s (%s)\n", args[0], args[1])
			return nil
		}),
	}
	add.Flags().BoolVar(&nonvoter, "nonvoter", false, "replicate to it without counting it in the quorum")
	cmd.AddCommand(add)
	cmd.AddCommand(&cobra.Command{
		Use:         "remove ID",
		Annotations: bounded,
		Short:       "Remove a member",
		Args:        cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			if err := c.RemoveMember(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "removed %s\n", args[0])
			return nil
		}),
	})
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printMembersJSON prints the members as the API's Member messages, with
// the leader's id.
func printMembersJSON(g *globals, st *fencev1.StatusResponse) error {
	members := make([]json.RawMessage, 0, len(st.GetMembers()))
	for _, m := range st.GetMembers() {
		data, err := rawJSON(m)
		if err != nil {
			return err
		}
		members = append(members, data)
	}
	return printJSONValue(g, map[string]any{"leaderId": st.GetLeaderId(), "members": members})
}

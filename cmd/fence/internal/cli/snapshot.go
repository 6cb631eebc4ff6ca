package cli

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/server"
)

func snapshotCommand(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Back up the group's state to a file, inspect a backup, restore one into a new data dir",
	}
	cmd.AddCommand(snapshotSaveCommand(g), snapshotInspectCommand(g), snapshotRestoreCommand(g))
	return cmd
}

func snapshotSaveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "save FILE",
		Short: "Save a consistent copy of the state, taken on the leader, to FILE (written atomically)",
		Args:  cobra.ExactArgs(1),
		RunE: g.withClient(func(cmd *cobra.Command, args []string, c *client.Client) error {
			snap, err := c.Snapshot(cmd.Context())
			if err != nil {
				return err
			}
			defer snap.Close()
			h := snap.Header
			err = server.WriteSnapshotFile(args[0], server.SnapshotHeader{
				Created: time.Now().UTC().Truncate(time.Second), NodeID: h.GetNodeId(), Version: h.GetVersion(),
				Index: h.GetIndex(), Term: h.GetTerm(), LastToken: h.GetLastToken(),
				Size: h.GetSize(), SHA256: hex.EncodeToString(h.GetSha256()),
			}, snap)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "saved %s: index %d, term %d, last token %d, %d bytes, from %s\n",
				args[0], h.GetIndex(), h.GetTerm(), h.GetLastToken(), h.GetSize(), h.GetNodeId())
			return nil
		}),
	}
}

func snapshotInspectCommand(g *globals) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect FILE",
		Short: "Verify a snapshot file's checksums and print its header and what it holds",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := server.ReadSnapshotFile(args[0])
			if err != nil {
				return err
			}
			h, n := f.Header, f.Counts()
			if asJSON {
				return printSnapshotJSON(g, h, n)
			}
			w := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			for _, row := range [][2]any{
				{"format", h.Format}, {"created", h.Created.Format(time.RFC3339)}, {"node", h.NodeID}, {"fence version", h.Version},
				{"index", h.Index}, {"term", h.Term}, {"last token", h.LastToken},
				{"body", fmt.Sprintf("%d bytes, SHA-256 %s (verified)", h.Size, h.SHA256)},
				{"sessions", n.Sessions}, {"locks", fmt.Sprintf("%d (%d holders, %d waiters)", n.Locks, n.Holders, n.Waiters)},
				{"kv keys", fmt.Sprintf("%d (%d tombstones), revision %d", n.Keys, n.Tombstones, n.KVRevision)},
				{"last session id", n.LastSessionID},
			} {
				fmt.Fprintf(w, "%s:\t%v\n", row[0], row[1])
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"format", "created", "header": the API's SnapshotHeader, "counts"}`)
	return cmd
}

// snapshotCountsJSON is what a snapshot holds, in the API's JSON style:
// camelCase, 64-bit counts, tokens and ids as strings (as Status gives
// its sessions and locks).
type snapshotCountsJSON struct {
	Sessions      string `json:"sessions"`
	Locks         string `json:"locks"`
	Holders       string `json:"holders"`
	Waiters       string `json:"waiters"`
	KVKeys        string `json:"kvKeys"`
	KVTombstones  string `json:"kvTombstones"`
	KVRevision    string `json:"kvRevision"`
	LastToken     string `json:"lastToken"`
	LastSessionID string `json:"lastSessionId"`
}

// printSnapshotJSON prints a snapshot file's header, as the API's
// SnapshotHeader (what fence snapshot save was given) with the file's
// format and creation time beside it, and what its state holds.
func printSnapshotJSON(g *globals, h server.SnapshotHeader, n server.SnapshotCounts) error {
	sum, err := hex.DecodeString(h.SHA256)
	if err != nil {
		return fmt.Errorf("the file's SHA-256 %q is not hex: %w", h.SHA256, err)
	}
	header, err := rawJSON(&fencev1.SnapshotHeader{Index: h.Index, Term: h.Term, LastToken: h.LastToken, Size: h.Size,
		Sha256: sum, NodeId: h.NodeID, Version: h.Version})
	if err != nil {
		return err
	}
	created, err := rawJSON(timestamppb.New(h.Created))
	if err != nil {
		return err
	}
	count := func(c int) string { return fmt.Sprint(c) }
	return printJSONValue(g, struct {
		Format  int                `json:"format"`
		Created json.RawMessage    `json:"created"`
		Header  json.RawMessage    `json:"header"`
		Counts  snapshotCountsJSON `json:"counts"`
	}{h.Format, created, header, snapshotCountsJSON{
		Sessions: count(n.Sessions), Locks: count(n.Locks), Holders: count(n.Holders), Waiters: count(n.Waiters),
		KVKeys: count(n.Keys), KVTombstones: count(n.Tombstones), KVRevision: jsonUint(n.KVRevision),
		LastToken: jsonUint(n.LastToken), LastSessionID: jsonUint(n.LastSessionID),
	}})
}

func snapshotRestoreCommand(g *globals) *cobra.Command {
	cfg := server.DefaultConfig()
	var (
		peers      peerList
		bump       uint64
		configFile string
	)
	cmd := &cobra.Command{
		Use:   "restore FILE --data-dir DIR",
		Short: "Make a new data dir from a snapshot file, for fence serve to start from",
		Long: `Make a new data dir from a snapshot file, for fence serve to start from.

DIR must not exist or be empty. Give the same --node-id, --raft-listen
(or --raft-advertise) and --peers that fence serve will be started with,
or the same --config (or FENCE_CONFIG) and FENCE_* variables: what this
command's flags leave unset is read from them as fence serve reads it,
the data dir included.
For a group, restore the same file on every member with the same --peers,
each with its own --node-id and data dir, then start them all.

The token counter, session ids and the KV revision are raised by --bump
(default 1e9), so that nothing the old group handed out after the snapshot
was taken is handed out again; --bump 0 keeps them.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := restoreSettingsFromServe(cmd, configFile, &cfg, &peers); err != nil {
				return err
			}
			if cfg.DataDir == "" {
				return fmt.Errorf("--data-dir is required: the new data dir to restore into (or data-dir in --config, or FENCE_DATA_DIR)")
			}
			if len(peers) > 0 {
				cfg.Peers = peers.addresses()
			}
			res, err := server.RestoreSnapshot(cfg, args[0], bump)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "restored %s into %s: index %d, term %d, last token %d (the snapshot's %d + %d); members %v\n",
				args[0], cfg.DataDir, res.Header.Index, res.Header.Term, res.LastToken, res.Header.LastToken, bump, res.Members)
			fmt.Fprintf(g.stdout, "start it with: fence serve --data-dir %s --node-id %s ...\n", cfg.DataDir, cfg.NodeID)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", "", "the new data dir (must not exist, or be empty)")
	f.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "the id this node will serve with")
	f.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "the raft address this node will serve with (a single node's member address)")
	f.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "the raft address peers will dial (default: --raft-listen)")
	f.Var(&peers, "peers", "the restored group's members, `id=raft-host:port,...` (this node included); the same on every member")
	f.StringVar(&cfg.LogStore, "log-store", "", "raft log of the new data dir: wal (default) or bolt")
	f.Uint64Var(&bump, "bump", server.DefaultRestoreBump, "raise the token counter, session ids and KV revision by this much")
	f.StringVar(&configFile, "config", "", "fence serve's YAML settings file (env "+configEnv+"): the node's settings this command's flags leave unset are read from it, and from FENCE_* variables, as fence serve will read them")
	return cmd
}

// restoreSettingsFromServe fills in the node's settings that restore's
// flags left unset (its id, raft addresses, peers, log store and data
// dir) from what fence serve will read: the settings file and the FENCE_*
// variables, so that the restored data dir names the node that serve then
// starts. A data dir is taken only where one of them sets it: serve's
// default is no choice for a restore.
func restoreSettingsFromServe(cmd *cobra.Command, configFile string, cfg *server.Config, peers *peerList) error {
	o, settings := newServeSettings()
	resolved, err := resolveSettings(settings, settingsFile(cmd, configFile), os.LookupEnv)
	if err != nil {
		return err
	}
	set := cmd.Flags().Changed
	for _, s := range []struct {
		name     string
		own, its *string
	}{
		{"node-id", &cfg.NodeID, &o.cfg.NodeID},
		{"raft-listen", &cfg.RaftListen, &o.cfg.RaftListen},
		{"raft-advertise", &cfg.RaftAdvertise, &o.cfg.RaftAdvertise},
		{"log-store", &cfg.LogStore, &o.cfg.LogStore},
		{"data-dir", &cfg.DataDir, &o.cfg.DataDir},
	} {
		if !set(s.name) && resolved.source(s.name) != fromDefault {
			*s.own = *s.its
		}
	}
	if !set("peers") && resolved.source("peers") != fromDefault {
		*peers = o.peers
	}
	return nil
}

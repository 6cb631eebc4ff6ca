package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/fencelock/fence/server"
)

// serveOptions are the settings of fence serve: what its flags, FENCE_*
// variables and --config file set.
type serveOptions struct {
	cfg            server.Config
	logLevel       string
	logFormat      string
	peers          peerList
	raftDial       peerList
	apiTLS         tlsFiles
	peerTLS        tlsFiles
	clientCertAuth bool
}

func serveCommand(g *globals) *cobra.Command {
	o, settings := newServeSettings()
	var (
		configFile  string
		printConfig bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a fence node (a single-node cluster by default, data in ./fence-data)",
		Long: `Runs a fence node: a single-node cluster by default, its data in ./fence-data.

Every flag can also be set as an environment variable FENCE_<FLAG> (upper
case, _ for -: FENCE_RAFT_LISTEN, FENCE_PEERS) and in the YAML file of
--config (or FENCE_CONFIG), whose keys are the flags' names. A flag wins
over a variable, which wins over the file. --print-config prints every
setting and where it came from, as a file that --config reads back.
See docs/configuration.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			file := settingsFile(cmd, configFile)
			resolved, err := resolveSettings(settings, file, os.LookupEnv)
			if err != nil {
				return err
			}
			if resolved.source("ui") == fromDefault {
				o.cfg.UI = isLoopback(o.cfg.Listen)
			}
			unknown := unknownFenceEnv(os.Environ(), settings, cmd.Root().PersistentFlags())
			if printConfig {
				for _, name := range unknown {
					fmt.Fprintf(g.stderr, "fence serve: %s is set, but is no setting of fence serve; ignored\n", name)
				}
				return resolved.write(g.stdout, file)
			}
			return o.serve(cmd.Context(), g.stderr, unknown)
		},
	}
	cmd.Flags().AddFlagSet(settings)
	cmd.Flags().StringVar(&configFile, "config", "", "read settings from this YAML file, its keys the flags' names (env "+configEnv+"); flags and FENCE_* variables win over it")
	cmd.Flags().BoolVar(&printConfig, "print-config", false, "print every setting and where it came from (flag, env, file, default), as YAML that --config reads, and exit")
	return cmd
}

// newServeSettings returns fence serve's options at their defaults and the
// flags that set them, one for every setting.
func newServeSettings() (*serveOptions, *pflag.FlagSet) {
	o := &serveOptions{cfg: server.DefaultConfig()}
	cfg := &o.cfg
	f := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f.StringVar(&o.apiTLS.cert, "cert-file", "", "serve the API over TLS with this certificate (PEM)")
	f.StringVar(&o.apiTLS.key, "key-file", "", "key of --cert-file")
	f.StringVar(&o.apiTLS.ca, "trusted-ca-file", "", "CA bundle for client certificates (with --client-cert-auth) and other nodes' API certificates")
	f.BoolVar(&o.clientCertAuth, "client-cert-auth", false, "require API clients to present a certificate signed by --trusted-ca-file")
	f.StringVar(&o.peerTLS.cert, "peer-cert-file", "", "run raft between nodes over mutual TLS with this certificate; every node of the group must")
	f.StringVar(&o.peerTLS.key, "peer-key-file", "", "key of --peer-cert-file")
	f.StringVar(&o.peerTLS.ca, "peer-trusted-ca-file", "", "CA bundle that peers' certificates must be signed by")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the raft log and snapshots")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "API address (Connect, gRPC, JSON over HTTP, /metrics)")
	f.StringVar(&cfg.ListenMetrics, "listen-metrics", "", "also serve /metrics, /healthz, /livez and /readyz over plain HTTP here (no TLS, no client certificates), for probes and scrapes")
	f.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "address raft peers reach this node on")
	f.StringVar(&cfg.Advertise, "advertise", "", "API address other nodes and clients use (default: --listen)")
	f.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "raft address peers dial (default: --raft-listen)")
	f.Var(&o.peers, "peers", "bootstrap a new group of these members: `id=host:port,...` (this node included)")
	f.Var(&o.raftDial, "raft-dial", "dial these peers at other addresses than the group's configuration says: `id=host:port,...` (proxies, NAT)")
	f.BoolVar(&cfg.Join, "join", false, "do not bootstrap: wait to be added with fence members add")
	f.BoolVar(&cfg.AutoRejoin, "auto-rejoin", cfg.AutoRejoin, "as the leader, add again a member whose data dir was lost when it asks (false: only fence members remove and add do)")
	f.Var(newChoice(&cfg.LogStore, cfg.LogStore, "", server.LogStoreWAL, server.LogStoreBolt), "log-store", "raft log of a new data dir: wal (segment files, one fsync per batch) or bolt (bbolt, two); default: the data dir's, wal for a new one")
	f.StringVar(&cfg.NodeID, "node-id", cfg.NodeID, "this node's id in its raft group; keep it across restarts")
	f.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "session TTL when a client names none")
	f.DurationVar(&cfg.MinTTL, "min-ttl", cfg.MinTTL, "shortest session TTL allowed")
	f.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "longest session TTL allowed")
	f.DurationVar(&cfg.MaxLockDelay, "max-lock-delay", cfg.MaxLockDelay, "longest lock-delay allowed")
	f.IntVar(&cfg.MaxNameBytes, "max-name-bytes", cfg.MaxNameBytes, "longest lock name, in bytes")
	f.IntVar(&cfg.MaxSessions, "max-sessions", cfg.MaxSessions, "most live sessions (0: no limit)")
	f.IntVar(&cfg.MaxWaitersPerLock, "max-waiters", cfg.MaxWaitersPerLock, "most waiters per lock (0: no limit)")
	f.IntVar(&cfg.MaxLocks, "max-locks", cfg.MaxLocks, "most locks held, waited for or delayed, in all (0: no limit)")
	f.IntVar(&cfg.MaxLocksPerSession, "max-session-locks", cfg.MaxLocksPerSession, "most locks one session holds or waits for (0: no limit)")
	f.IntVar(&cfg.MaxPermits, "max-permits", cfg.MaxPermits, "most permits a semaphore may have")
	f.IntVar(&cfg.MaxRequestBytes, "max-request-bytes", cfg.MaxRequestBytes, "largest request message, in bytes")
	f.IntVar(&cfg.MaxKeyBytes, "max-key-bytes", cfg.MaxKeyBytes, "longest KV key, in bytes")
	f.IntVar(&cfg.MaxValueBytes, "max-value-bytes", cfg.MaxValueBytes, "largest KV value, in bytes")
	f.Int64Var(&cfg.MinFreeDisk, "min-free-disk", cfg.MinFreeDisk, "free space of the data dir's disk, in bytes, under which a leader hands leadership to a voter with room (0: only once a write finds none)")
	f.IntVar(&cfg.MaxKeys, "max-keys", cfg.MaxKeys, "most live KV keys (0: no limit)")
	f.IntVar(&cfg.MaxTxnOps, "max-txn-ops", cfg.MaxTxnOps, "most operations of one KV txn, its compares included")
	f.IntVar(&cfg.MaxTxnBytes, "max-txn-bytes", cfg.MaxTxnBytes, "most bytes of keys and values in one KV txn")
	f.Var(newRate(&cfg.SessionRate), "session-rate", "sessions each user (auth on, unless its quota sets its own) or client address (auth off) may create on average, a rate: "+rateSyntax+" (0: no limit; needs --session-burst)")
	f.IntVar(&cfg.SessionBurst, "session-burst", cfg.SessionBurst, "sessions each user or client address may create at once (with --session-rate)")
	f.IntVar(&cfg.MaxWatchers, "max-watchers", cfg.MaxWatchers, "most open watches (KV and lock) per node (0: no limit)")
	f.IntVar(&cfg.MaxStreamOps, "max-stream-ops", cfg.MaxStreamOps, "most operations one client connection runs at once on its session streams, all together; more wait to be read")
	f.IntVar(&cfg.WatchHistory, "watch-history", cfg.WatchHistory, "recent KV changes, and recent lock events, kept for watches that start at a past revision")
	f.IntVar(&cfg.MaxConnections, "max-connections", cfg.MaxConnections, "most API connections open at once, lowered to leave 256 of the open-file limit to raft and snapshots (0: the file limit only); more wait")
	f.DurationVar(&cfg.ReadTimeout, "read-timeout", cfg.ReadTimeout, "longest a client may take to send a request's headers, and then its body (not its answer)")
	f.DurationVar(&cfg.WriteTimeout, "write-timeout", cfg.WriteTimeout, "end a call, and close its connection, when one write of its answer waits this long for a client that does not read (0: never; a framed session stream: 45s)")
	f.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "close a keep-alive API connection idle this long")
	f.DurationVar(&cfg.HeartbeatTimeout, "heartbeat-timeout", cfg.HeartbeatTimeout, "raft heartbeat timeout")
	f.DurationVar(&cfg.ElectionTimeout, "election-timeout", cfg.ElectionTimeout, "raft election timeout")
	f.IntVar(&cfg.WALSegmentMB, "wal-segment-mb", 0, "size of the raft log's segment files in MiB (0: 64); each takes its space when it starts")
	f.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", cfg.SnapshotThreshold, "log entries between snapshots")
	f.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "how often to check whether a snapshot is due")
	f.BoolVar(&cfg.UI, "ui", false, "serve the console, a read-only live page of the group, at /ui/ on the API port (default: on when --listen is a loopback address)")
	f.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's profiler under /debug/pprof/ on the API port")
	o.logLevel = "info"
	f.Var(newChecked(&o.logLevel, checkLogLevel, "debug, info, warn or error"), "log-level", "debug, info, warn or error")
	f.Var(newChoice(&o.logFormat, "text", "text", "json"), "log-format", "text (logfmt) or json, one record a line on stderr")
	return o, f
}

// serve runs the node until ctx ends or the node fails. unknown are FENCE_
// variables that are no setting, which it warns of.
func (o *serveOptions) serve(ctx context.Context, stderr io.Writer, unknown []string) error {
	cfg := o.cfg
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil { // checked when set
		return fmt.Errorf("log-level: %w", err)
	}
	logger, err := newLogger(stderr, o.logFormat, level)
	if err != nil {
		return err
	}
	for _, name := range unknown {
		logger.Warn("a FENCE_ variable is set that is no setting of fence serve; ignored (see fence serve --help)", "variable", name)
	}
	if len(o.peers) > 0 {
		cfg.Peers = o.peers.addresses()
	}
	if len(o.raftDial) > 0 {
		dial := o.raftDial.addresses()
		if _, ok := dial[cfg.NodeID]; !ok { // raft asks for its own address too
			dial[cfg.NodeID] = cmp.Or(cfg.RaftAdvertise, cfg.RaftListen)
		}
		cfg.RaftAddressProvider = server.DialAddresses(dial)
	}
	if cfg.TLS, err = o.apiTLS.config("API TLS", true, o.clientCertAuth); err != nil {
		return err
	}
	if cfg.PeerTLS, err = o.peerTLS.config("peer TLS", true, o.peerTLS != (tlsFiles{})); err != nil {
		return err
	}
	cfg.Logger = logger
	srv, err := server.Start(cfg)
	if err != nil {
		return err
	}
	if cfg.UI {
		logger.Info("console", "url", consoleURL(srv.Addr(), cfg.TLS != nil))
	}
	if !isLoopback(cfg.Listen) {
		go warnUnsecured(logger, srv, cfg)
	}
	select {
	case <-ctx.Done():
	case <-srv.Failed():
		srv.Close()
		return srv.Err()
	}
	logger.Info("shutting down")
	// A leader hands over to another member before it closes
	// (bounded: raft gives up after an election timeout).
	stopCtx, cancel := context.WithTimeout(context.Background(), cfg.ElectionTimeout+2*time.Second)
	defer cancel()
	return srv.Shutdown(stopCtx)
}

// newLogger returns the node's logger: every line it writes, raft's
// included, goes through it.
func newLogger(w io.Writer, format string, level slog.Level) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// warnUnsecured warns that a node reachable from other machines serves
// without TLS, or without auth once its state is known (a leader is).
func warnUnsecured(logger *slog.Logger, srv *server.Server, cfg server.Config) {
	if cfg.TLS == nil {
		logger.Warn("the API listens beyond loopback without TLS: anyone on the network can read and send calls; see docs/security.md", "listen", cfg.Listen)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.WaitLeader(ctx); err == nil && !srv.AuthEnabled() {
		logger.Warn("the API listens beyond loopback with auth off: any client that reaches it may take every lock, write every key and change the membership; see docs/security.md (fence auth enable)", "listen", cfg.Listen)
	}
}

// isLoopback reports whether the API address listens on loopback only, where
// the console is on unless --ui=false.
func isLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// consoleURL is where the console of the node serving addr is.
func consoleURL(addr string, tls bool) string {
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + addr + "/ui/"
}

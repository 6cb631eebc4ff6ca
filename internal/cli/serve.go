package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencelock/fence/server"
)

func serveCommand(g *globals) *cobra.Command {
	cfg := server.DefaultConfig()
	var (
		logLevel       string
		logFormat      string
		peers          string
		raftDial       string
		apiTLS         tlsFiles
		peerTLS        tlsFiles
		clientCertAuth bool
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a fence node (a single-node cluster by default, data in ./fence-data)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			logger, err := newLogger(g.stderr, logFormat, level)
			if err != nil {
				return err
			}
			if peers != "" {
				var err error
				if cfg.Peers, err = parsePeers(peers); err != nil {
					return fmt.Errorf("--peers: %w", err)
				}
			}
			if raftDial != "" {
				dial, err := parsePeers(raftDial)
				if err != nil {
					return fmt.Errorf("--raft-dial: %w", err)
				}
				if _, ok := dial[cfg.NodeID]; !ok { // raft asks for its own address too
					dial[cfg.NodeID] = cmp.Or(cfg.RaftAdvertise, cfg.RaftListen)
				}
				cfg.RaftAddressProvider = server.DialAddresses(dial)
			}
			if cfg.TLS, err = apiTLS.config("API TLS", true, clientCertAuth); err != nil {
				return err
			}
			if cfg.PeerTLS, err = peerTLS.config("peer TLS", true, peerTLS != (tlsFiles{})); err != nil {
				return err
			}
			if !cmd.Flags().Changed("ui") {
				cfg.UI = isLoopback(cfg.Listen)
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
			case <-cmd.Context().Done():
			case <-srv.Failed():
				srv.Close()
				return srv.Err()
			}
			logger.Info("shutting down")
			// A leader hands over to another member before it closes
			// (bounded: raft gives up after an election timeout).
			ctx, cancel := context.WithTimeout(context.Background(), cfg.ElectionTimeout+2*time.Second)
			defer cancel()
			return srv.Shutdown(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&apiTLS.cert, "cert-file", "", "serve the API over TLS with this certificate (PEM)")
	f.StringVar(&apiTLS.key, "key-file", "", "key of --cert-file")
	f.StringVar(&apiTLS.ca, "trusted-ca-file", "", "CA bundle for client certificates (with --client-cert-auth) and other nodes' API certificates")
	f.BoolVar(&clientCertAuth, "client-cert-auth", false, "require API clients to present a certificate signed by --trusted-ca-file")
	f.StringVar(&peerTLS.cert, "peer-cert-file", "", "run raft between nodes over mutual TLS with this certificate; every node of the group must")
	f.StringVar(&peerTLS.key, "peer-key-file", "", "key of --peer-cert-file")
	f.StringVar(&peerTLS.ca, "peer-trusted-ca-file", "", "CA bundle that peers' certificates must be signed by")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory for the raft log and snapshots")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "API address (Connect, gRPC, JSON over HTTP, /metrics)")
	f.StringVar(&cfg.ListenMetrics, "listen-metrics", "", "also serve /metrics, /healthz, /livez and /readyz over plain HTTP here (no TLS, no client certificates), for probes and scrapes")
	f.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "address raft peers reach this node on")
	f.StringVar(&cfg.Advertise, "advertise", "", "API address other nodes and clients use (default: --listen)")
	f.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "raft address peers dial (default: --raft-listen)")
	f.StringVar(&peers, "peers", "", "bootstrap a new group of these members: id=raft-host:port,... (this node included)")
	f.StringVar(&raftDial, "raft-dial", "", "dial these peers at other addresses than the group's configuration says: id=host:port,... (proxies, NAT)")
	f.BoolVar(&cfg.Join, "join", false, "do not bootstrap: wait to be added with fence members add")
	f.BoolVar(&cfg.AutoRejoin, "auto-rejoin", cfg.AutoRejoin, "as the leader, add again a member whose data dir was lost when it asks (false: only fence members remove and add do)")
	f.StringVar(&cfg.LogStore, "log-store", cfg.LogStore, "raft log of a new data dir: wal (segment files, one fsync per batch) or bolt (bbolt, two); default: the data dir's, wal for a new one")
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
	f.IntVar(&cfg.MaxKeys, "max-keys", cfg.MaxKeys, "most live KV keys (0: no limit)")
	f.Float64Var(&cfg.SessionRate, "session-rate", cfg.SessionRate, "sessions per second each user (auth on, unless its quota sets its own) or client address (auth off) may create, on average (0: no limit; needs --session-burst)")
	f.IntVar(&cfg.SessionBurst, "session-burst", cfg.SessionBurst, "sessions each user or client address may create at once (with --session-rate)")
	f.IntVar(&cfg.MaxWatchers, "max-watchers", cfg.MaxWatchers, "most open KV watches per node (0: no limit)")
	f.IntVar(&cfg.MaxStreamOps, "max-stream-ops", cfg.MaxStreamOps, "most operations one client connection runs at once on its session streams, all together; more wait to be read")
	f.IntVar(&cfg.WatchHistory, "watch-history", cfg.WatchHistory, "recent KV changes kept for watches that start at a past revision")
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
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text (logfmt) or json, one record a line on stderr")
	return cmd
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

// parsePeers parses id=host:port,id=host:port.
func parsePeers(s string) (map[string]string, error) {
	peers := map[string]string{}
	for _, p := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("%q is not id=host:port", p)
		}
		if _, dup := peers[id]; dup {
			return nil, fmt.Errorf("%s is listed twice", id)
		}
		peers[id] = addr
	}
	return peers, nil
}

// warnUnsecured warns that a node reachable from other machines serves
// without TLS, or without auth once its state is known (a leader is).
func warnUnsecured(logger *slog.Logger, srv *server.Server, cfg server.Config) {
	if cfg.TLS == nil {
		logger.Warn("the API listens beyond loopback without TLS: anyone on the network can read and send calls; see README, Securing fence", "listen", cfg.Listen)
	}
	if err := srv.WaitLeader(time.Minute); err == nil && !srv.AuthEnabled() {
		logger.Warn("the API listens beyond loopback with auth off: any client that reaches it may take every lock, write every key and change the membership; see README, Securing fence (fence auth enable)", "listen", cfg.Listen)
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

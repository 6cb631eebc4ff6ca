package server

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/fencelock/fence/internal/buildinfo"
	"github.com/fencelock/fence/internal/clock"
	"github.com/fencelock/fence/internal/fsm"
)

// Config is a node's configuration. Start from DefaultConfig and change what
// you need; Start calls Validate.
type Config struct {
	// NodeID names this node in its raft group. It must stay the same across
	// restarts of the node.
	NodeID string
	// DataDir holds the raft log, its stable store and the snapshots.
	DataDir string
	// Listen is the API address: Connect, gRPC and JSON over HTTP, plus
	// /metrics, /healthz, /livez and /readyz. Port 0 picks a free port (see Server.Addr).
	Listen string
	// ListenMetrics, when set, is a second address serving /metrics,
	// /healthz, /livez and /readyz over plain HTTP, without TLS or client
	// certificates, for probes and scrapes beside an API that requires them
	// (etcd's --listen-metrics-urls). Port 0 picks a free port (see
	// Server.MetricsAddr).
	ListenMetrics string
	// Advertise is the API address other nodes and clients use to reach
	// this node (default: the address Listen bound).
	Advertise string
	// RaftListen is the address raft binds.
	RaftListen string
	// RaftAdvertise is the address raft peers dial (default: RaftListen).
	RaftAdvertise string
	// Peers, for a static bootstrap of a new group: every member's id and
	// raft address, this node's included. Empty bootstraps a single node.
	// Ignored once the data dir holds raft state.
	Peers map[string]string
	// Join starts the node without bootstrapping, to be added to an
	// existing group with AddMember (fence members add).
	Join bool
	// AutoRejoin, on a group's nodes, lets a member whose data dir was
	// lost ask the leader to add it again (docs/design.md, "A group knows
	// itself"): the leader removes the member and adds it back as a new
	// one, when the node at the member's address answers with no data and
	// the group keeps a reachable quorum without it. Off, such a node
	// waits for an operator's fence members remove and add.
	AutoRejoin bool
	// RaftAddressProvider, when set, maps a peer's id to the address this
	// node dials, overriding the address in the raft configuration (for
	// address translation, and for tests that cut links).
	RaftAddressProvider raft.ServerAddressProvider
	// TLS, when set, serves the API over TLS (HTTP/1.1 and HTTP/2) with
	// its Certificates. Set ClientAuth and ClientCAs in it to require
	// client certificates. Set RootCAs too where other nodes' API
	// certificates are not signed by a system CA: a follower registers its
	// API address with the leader over the API, presenting its own
	// certificate as a client's.
	TLS *tls.Config
	// PeerTLS, when set, carries raft traffic between nodes over mutual
	// TLS; every node of a group must set it. It serves the node's
	// Certificates to peers that dial it, and must require and verify
	// theirs (ClientAuth tls.RequireAndVerifyClientCert, ClientCAs), and it
	// dials peers with the same Certificates, verifying them by RootCAs.
	PeerTLS *tls.Config
	// LogStore is where the raft log of a new data dir lives: LogStoreWAL
	// or LogStoreBolt. Empty (the default) means the store the data dir
	// already has, or LogStoreWAL for a new one; a data dir keeps the store
	// it was created with, so naming the other one is an error.
	LogStore string
	// WALSegmentMB is the size of the raft-wal log's segment files, in
	// MiB (Consul's segment_size_mb); 0 means raft-wal's 64. A segment's
	// space is taken when it is started, so a disk that fills up stops the
	// log only when the next segment starts.
	WALSegmentMB int

	// DefaultTTL is a session's TTL when the request names none.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound the TTLs clients may ask for.
	MinTTL, MaxTTL time.Duration
	// MaxLockDelay bounds the lock-delay an acquire may ask for.
	MaxLockDelay time.Duration
	// MinFreeDisk is the free space, in bytes, under which the data dir's
	// disk counts as low: the node says so in Status, and a leader hands
	// leadership to a voter with room (diskwatch.go). 0: only once a write
	// found no space.
	MinFreeDisk int64
	// MaxNameBytes bounds lock names.
	MaxNameBytes int
	// MaxOwnerBytes bounds a session's owner text.
	MaxOwnerBytes int
	// MaxSessions bounds the number of live sessions; 0 means no limit.
	MaxSessions int
	// MaxWaitersPerLock bounds each lock's queue; 0 means no limit.
	MaxWaitersPerLock int
	// MaxLocks bounds the locks held, waited for or delayed, in all;
	// MaxLocksPerSession those one session holds or waits for. 0: no limit.
	MaxLocks, MaxLocksPerSession int
	// MaxPermits bounds a semaphore's number of permits.
	MaxPermits int
	// MaxRequestBytes bounds the size of one request message.
	MaxRequestBytes int
	// MaxKeyBytes and MaxValueBytes bound the fenced KV store's keys and values.
	MaxKeyBytes, MaxValueBytes int
	// MaxKeys bounds the live keys of the KV store; 0 means no limit.
	MaxKeys int
	// MaxTxnOps bounds the operations of one KV txn, its compares
	// included, and MaxTxnBytes the bytes of its keys and values.
	MaxTxnOps, MaxTxnBytes int
	// SessionRate (sessions per second) and SessionBurst bound how fast
	// each identity creates sessions, with a token bucket kept by the
	// leader: each user with auth on, unless the user's quota sets its
	// own, and each client address with auth off. 0: no bound.
	SessionRate  float64
	SessionBurst int
	// MaxWatchers bounds the watches open on this node, KV and lock
	// watches together; 0 means no limit.
	MaxWatchers int
	// MaxStreamOps bounds the operations one API connection runs at once
	// on its session streams, all of them together. A client learns it when
	// it opens a stream, and keeps to it; at the bound the node reads no
	// further operation from that connection until one ends, which holds
	// the client back through HTTP/2's flow control and nobody else.
	MaxStreamOps int
	// WatchHistory is how many recent KV changes, and how many recent lock
	// events, the node keeps for watches that start at a past revision
	// (each also bounded to 64 MiB); 0 keeps none.
	WatchHistory int

	// MaxConnections bounds the API connections open at once. The node
	// lowers it to leave 256 of its open-file limit (RLIMIT_NOFILE, which Go
	// raises to the hard limit at start) to raft, the data files and
	// snapshots; 0 means that the open-file limit alone bounds them. At the
	// bound, a new connection waits in the listen queue until one closes.
	MaxConnections int
	// ReadTimeout bounds how long a client may take to send a request's
	// headers, and then again how long it may take to send its body. It
	// does not bound the answer: a blocked acquire or a watch lasts as long
	// as it needs. A connection whose body did not arrive in time is closed.
	ReadTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that has carried no call
	// for this long.
	IdleTimeout time.Duration
	// WriteTimeout bounds each write of an answer: a client that stops
	// reading (its socket's buffers full) has its call ended and its
	// connection closed after this long. Answers that take long (waits,
	// watches) are not bounded as a whole. 0: no bound, but for a framed
	// session stream, whose writes are then bounded by the 45 seconds of
	// silence after which it is dropped.
	WriteTimeout time.Duration

	// ApplyTimeout bounds how long a write waits to be committed.
	ApplyTimeout time.Duration
	// HeartbeatTimeout and ElectionTimeout are raft's; lower values fail
	// over faster and tolerate less network delay.
	HeartbeatTimeout, ElectionTimeout time.Duration
	// SnapshotThreshold is how many log entries may accumulate before a
	// snapshot compacts them.
	SnapshotThreshold uint64
	// SnapshotInterval is how often raft considers taking a snapshot.
	SnapshotInterval time.Duration

	// Clock is the leader's monotonic clock for session expiry and
	// lock-delay, and the clock of wait timeouts. Tests inject a fake.
	Clock clock.Clock
	// Logger receives the node's logs; nil discards them.
	Logger *slog.Logger
	// Version is reported by Status and in the fence_build_info metric
	// (default: the binary's module version and VCS revision).
	Version string
	// Pprof serves Go's profiler under /debug/pprof/ on the API port.
	Pprof bool
	// UI serves the console, a read-only live page of the group, under
	// /ui/ on the API port, with the API's TLS settings.
	UI bool

	// openParts, when set, opens the parts the node is assembled from in
	// place of openParts: a test's own.
	openParts func(cfg Config, hlog hclog.Logger, logger *slog.Logger, snapshotOpened func(index uint64)) (nodeParts, error)
}

// DefaultConfig returns the configuration `fence serve` runs with when given
// no flags: a single node keeping its data in ./fence-data.
func DefaultConfig() Config {
	return Config{
		NodeID:             "fence1",
		DataDir:            "fence-data",
		Listen:             "127.0.0.1:7420",
		RaftListen:         "127.0.0.1:7421",
		AutoRejoin:         true,
		DefaultTTL:         10 * time.Second,
		MinTTL:             time.Second,
		MaxTTL:             time.Hour,
		MaxLockDelay:       time.Minute,
		MinFreeDisk:        64 << 20,
		MaxNameBytes:       512,
		MaxOwnerBytes:      256,
		MaxSessions:        100_000,
		MaxWaitersPerLock:  10_000,
		MaxLocks:           100_000,
		MaxLocksPerSession: 10_000,
		MaxPermits:         10_000,
		MaxRequestBytes:    1 << 20,
		MaxKeyBytes:        1024,
		MaxValueBytes:      256 << 10,
		MaxKeys:            1_000_000,
		MaxTxnOps:          128,
		MaxTxnBytes:        1 << 20,
		MaxWatchers:        10_000,
		MaxStreamOps:       1024,
		WatchHistory:       10_000,
		MaxConnections:     10_000,
		ReadTimeout:        10 * time.Second,
		WriteTimeout:       10 * time.Second,
		IdleTimeout:        2 * time.Minute,
		ApplyTimeout:       10 * time.Second,
		HeartbeatTimeout:   500 * time.Millisecond,
		ElectionTimeout:    500 * time.Millisecond,
		SnapshotThreshold:  8192,
		SnapshotInterval:   30 * time.Second,
		Clock:              clock.Real,
		Version:            buildinfo.Read().Short(),
	}
}

// Validate reports every setting that cannot work, each in words that name
// it, joined in one error (nil when all can).
func (c Config) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.NodeID != "", "node id is empty")
	check(c.DataDir != "", "data dir is empty")
	_, _, err := net.SplitHostPort(c.Listen)
	check(err == nil, "listen address %q: want host:port", c.Listen)
	if c.ListenMetrics != "" {
		_, _, err = net.SplitHostPort(c.ListenMetrics)
		check(err == nil, "metrics listen address %q: want host:port", c.ListenMetrics)
	}
	_, _, err = net.SplitHostPort(c.RaftListen)
	check(err == nil, "raft listen address %q: want host:port", c.RaftListen)
	if len(c.Peers) > 0 {
		_, self := c.Peers[c.NodeID]
		check(self, "peers %v do not include this node %q", c.Peers, c.NodeID)
		check(!c.Join, "a node either bootstraps with peers or joins, not both")
		for id, addr := range c.Peers {
			_, _, err := net.SplitHostPort(addr)
			check(id != "" && err == nil, "peer %q=%q: want id=host:port", id, addr)
		}
	}
	check(c.LogStore == "" || c.LogStore == LogStoreWAL || c.LogStore == LogStoreBolt, "log store %q: want %q or %q", c.LogStore, LogStoreWAL, LogStoreBolt)
	check(c.MinTTL > 0, "min TTL %v must be positive", c.MinTTL)
	check(c.MinTTL <= c.DefaultTTL && c.DefaultTTL <= c.MaxTTL, "default TTL %v must lie within %v..%v", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	check(c.MaxLockDelay >= 0, "max lock-delay %v is negative", c.MaxLockDelay)
	check(c.MinFreeDisk >= 0, "min free disk is negative")
	check(c.MaxNameBytes > 0, "max name bytes must be positive")
	check(c.MaxOwnerBytes >= 0, "max owner bytes is negative")
	check(c.MaxSessions >= 0, "max sessions is negative")
	check(c.MaxWaitersPerLock >= 0, "max waiters per lock is negative")
	check(c.MaxLocks >= 0, "max locks is negative")
	check(c.MaxLocksPerSession >= 0, "max locks per session is negative")
	check(c.MaxPermits > 0, "max permits must be positive")
	check(c.PeerTLS == nil || c.PeerTLS.ClientAuth == tls.RequireAndVerifyClientCert,
		"peer TLS must require and verify the peers' certificates (ClientAuth tls.RequireAndVerifyClientCert), or anyone can join raft")
	check(c.MaxRequestBytes >= 1024, "max request bytes %d is below 1024", c.MaxRequestBytes)
	check(c.MaxKeyBytes > 0, "max key bytes must be positive")
	check(c.MaxValueBytes >= 0, "max value bytes is negative")
	check(c.MaxKeys >= 0, "max keys is negative")
	check(c.MaxTxnOps > 0, "max txn ops must be positive")
	check(c.MaxTxnBytes > 0, "max txn bytes must be positive")
	check(c.SessionRate >= 0 && c.SessionRate <= fsm.MaxSessionRate, "session rate %v: want 0 (no bound) to %g sessions a second", c.SessionRate, fsm.MaxSessionRate)
	check(c.SessionBurst >= 0 && uint64(c.SessionBurst) <= fsm.MaxQuotaCount, "session burst %d: want 0 to %d", c.SessionBurst, fsm.MaxQuotaCount)
	check((c.SessionRate > 0) == (c.SessionBurst > 0), "session rate %v and burst %d: set both, or neither", c.SessionRate, c.SessionBurst)
	check(c.MaxWatchers >= 0, "max watchers is negative")
	check(c.MaxStreamOps > 0 && c.MaxStreamOps <= 1<<20, "max stream ops %d: want 1 to %d", c.MaxStreamOps, 1<<20)
	check(c.WatchHistory >= 0, "watch history is negative")
	check(c.MaxConnections >= 0, "max connections is negative")
	check(c.ReadTimeout > 0, "read timeout must be positive")
	check(c.WriteTimeout >= 0, "write timeout must not be negative")
	check(c.IdleTimeout > 0, "idle timeout must be positive")
	check(c.ApplyTimeout > 0, "apply timeout must be positive")
	check(c.HeartbeatTimeout >= 5*time.Millisecond, "heartbeat timeout %v is below 5ms", c.HeartbeatTimeout)
	check(c.ElectionTimeout >= c.HeartbeatTimeout, "election timeout %v is below the heartbeat timeout", c.ElectionTimeout)
	check(c.SnapshotThreshold > 0, "snapshot threshold must be positive")
	check(c.WALSegmentMB >= 0 && c.WALSegmentMB <= 1024, "WAL segment size %d MiB: want 1 to 1024 (0: 64)", c.WALSegmentMB)
	check(c.SnapshotInterval > 0, "snapshot interval must be positive")
	check(c.Clock != nil, "clock is nil")
	return errors.Join(errs...)
}

// DialAddresses is a raft.ServerAddressProvider that dials the listed peers
// at the given addresses, and every other peer at its configured address.
type DialAddresses map[string]string

// ServerAddr implements raft.ServerAddressProvider.
func (d DialAddresses) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if addr, ok := d[string(id)]; ok {
		return raft.ServerAddress(addr), nil
	}
	return "", fmt.Errorf("no dial address for %s", id)
}

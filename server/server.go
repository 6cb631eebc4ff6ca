// Package server is fence's lock service node: a replicated state machine
// (package internal/fsm) on hashicorp/raft, served over Connect, gRPC and
// JSON on one port.
//
// Writes go through raft and are answered only once committed. Session
// deadlines live in the leader's memory on its monotonic clock; a keepalive
// renews that memory, then waits for a confirmation that this node still
// led after the keepalive arrived (leaseConfirmer), and an expiry is
// committed as a command. A node that is not the leader answers writes
// with Unavailable (or forwards them; see forwarder).
//
// A program runs a node with Start(cfg), or with New(cfg) and then its
// Start method; Shutdown (for SIGTERM: it hands leadership over first) or
// Close stops it. The node is assembled from parts below this package:
// what it keeps on disk (internal/durable) and its API port's plumbing
// (internal/apinet).
package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/server/internal/apinet"
	"github.com/fencelock/fence/server/internal/durable"
	"github.com/fencelock/fence/server/internal/opstream"
)

// Server is a running fence node. Start returns one; Close stops it.
type Server struct {
	cfg     Config
	logger  *slog.Logger
	fsm     *fsm.FSM
	node    *node
	hub     *waitHub
	watches *eventHub[fsm.KVEvent]

	// lockWatches numbers the lock events and serves LockService.Watch.
	lockWatches *lockFeed
	// snapshotOpened is the raft index of the snapshot last opened: the
	// one a restore reads (durable.TidySnapshots.Open).
	snapshotOpened atomic.Uint64

	tracker *sessionTracker
	// limiter bounds how fast each identity creates sessions (ratelimit.go).
	limiter *sessionLimiter
	delays  *delayScheduler
	metrics *metrics
	console *console // the page at /ui/ and its recent events
	// confirmer proves leadership after a call arrived, for keepalives
	// and linearizable reads.
	confirmer *leaseConfirmer

	dirLock   *durable.DataDirLock // held on cfg.DataDir while the node runs
	ln        net.Listener
	conns     *apinet.LimitListener // ln, when API connections are bounded
	http      *http.Server
	advertise string     // the API address others reach this node on
	forwarder *forwarder // the HTTP handler: forwards to the leader, or serves here
	// api is the API's whole handler while the node runs (Handler), nil
	// before Start and after Close.
	api         atomic.Pointer[http.Handler]
	metricsLn   net.Listener // cfg.ListenMetrics, when set
	metricsHTTP *http.Server // /metrics and the probes on metricsLn
	live        *liveness    // /livez's check of the main loops

	// leaderReady is set while this node is the leader and has applied
	// every entry of earlier terms.
	leaderReady atomic.Bool
	// restores counts snapshot restores: at start, and from the leader.
	restores atomic.Int64
	// cluster is the group's id, as read from the state.
	cluster clusterName
	// ident is whom the data dir belongs to (identity.go).
	ident *identity
	// reserve bounds, on disk, every token this node has applied.
	reserve *durable.TokenReserve
	// authChanges wakes open watches to check their caller again.
	authChanges authChanges
	// leaderTerm ends session streams when this node stops leading.
	leaderTerm leaderTerm
	// stoodDown is when this node last asked a successor to stand for
	// election after its log write failed (UnixNano; diskwatch.go).
	stoodDown atomic.Int64
	// streams serves session streams, each operation through runStreamOp.
	streams *opstream.Streams
	// upgrades holds the framed streams open: their connections are taken
	// from the HTTP server, whose Shutdown does not wait for them.
	upgrades opstream.Upgrades

	// bootstrapNote says why a node with no data has not bootstrapped
	// its group yet, nil when it has or need not (bootstrap.go).
	bootstrapNote atomic.Pointer[string]
	bootstrapLogs logLimiter
	// rejoining are the members being added again (rejoin.go).
	rejoining rejoins
	// changing serializes the configuration changes of members added
	// again with an operator's removals, so that a removal by hand is
	// never followed by the add of a rejoin under way.
	changing sync.Mutex
	// rejoinStarted is set once this node asks to be added again.
	rejoinStarted atomic.Bool
	// rejoinFailpoint, set by tests only, is called as this node, leading,
	// reaches each step of adding a member again (reachRejoinStep).
	rejoinFailpoint atomic.Pointer[rejoinHook]
	// failed is closed when the node stopped by itself, for failure.
	failed     chan struct{}
	failOnce   sync.Once
	failReason error

	done      chan struct{}
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	// life is the stage of the node's life (lifeNew, ...), under lifeMu:
	// it starts once, and not once closed.
	lifeMu sync.Mutex
	life   int
}

// The stages of a Server's life.
const (
	lifeNew     = iota // made by New, holding nothing
	lifeStarted        // Start began: files, sockets and goroutines are the node's
	lifeClosed         // closed after it started
	lifeOver           // closed unstarted, or its Start failed: it held nothing
)

// Start makes a node with New and starts it: the one call most programs
// need. It returns once the API's port is open; a single node becomes
// leader about one heartbeat timeout later.
func Start(cfg Config) (*Server, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Start(); err != nil {
		return nil, err
	}
	return s, nil
}

// New checks cfg and makes a node that is not running: it holds no file,
// no socket and no goroutine until Start, and Close lets it go unstarted.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid config: %w", err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return newServer(cfg, logger), nil
}

// Start opens the node's data, joins (or bootstraps) its raft group and
// serves the API on the config's Listen. It returns once the port is open;
// a single node becomes leader about one heartbeat timeout later. A node
// starts once: Start again, or after Close, fails. A failed Start leaves
// nothing open, and the node cannot be started again.
func (s *Server) Start() error {
	s.lifeMu.Lock()
	defer s.lifeMu.Unlock()
	switch s.life {
	case lifeStarted:
		return errors.New("server: Start of a node started already")
	case lifeClosed, lifeOver:
		return errors.New("server: Start of a node closed, or whose Start failed")
	}
	s.life = lifeStarted
	if err := s.start(); err != nil {
		s.life = lifeOver
		return err
	}
	return nil
}

// start is Start's work, once.
func (s *Server) start() error {
	cfg, logger := s.cfg, s.logger
	s.tracker.start()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		s.tracker.stop()
		return fmt.Errorf("creating data dir: %w", err)
	}
	lock, err := durable.LockDataDir(cfg.DataDir)
	if err != nil {
		s.tracker.stop()
		return err
	}
	s.dirLock = lock
	abort := func(err error) error {
		if s.ln != nil {
			s.ln.Close()
		}
		if s.metricsLn != nil {
			s.metricsLn.Close()
		}
		s.tracker.stop()
		lock.Unlock()
		return err
	}
	if s.reserve, err = durable.OpenTokenReserve(cfg.DataDir); err != nil {
		return abort(err)
	}
	if err := s.listen(); err != nil {
		return abort(err)
	}
	if s.ident, err = openIdentity(cfg.DataDir); err != nil {
		return abort(err)
	}
	if s.node, err = openNode(cfg, s.advertise, s.ident, s.fsm, s.snapshotOpened.Store, logger, s.metrics.storage); err != nil {
		return abort(err)
	}
	s.node.log.OnWriteFailed(s.leaderWriteFailed)
	s.learnGroup()
	s.serveRejoins()
	if s.ident.rejoining.Load() {
		s.startRejoin() // asked before a restart, and not a voter yet
	}
	if err := s.startBootstrap(); err != nil {
		s.node.close()
		return abort(err)
	}

	s.serve()
	logger.Info("fence node started", "node", cfg.NodeID, "version", cfg.Version, "listen", s.Addr(), "tls", cfg.TLS != nil, "metrics", s.MetricsAddr(), "raft", s.node.transport.LocalAddr(), "data", cfg.DataDir, "max_connections", s.maxConnections())
	return nil
}

// newServer makes a node's parts that hold no file and no socket.
func newServer(cfg Config, logger *slog.Logger) *Server {
	s := &Server{cfg: cfg, logger: logger, hub: newWaitHub(), done: make(chan struct{}), failed: make(chan struct{})}
	slots := &watchSlots{limit: cfg.MaxWatchers}
	s.watches = newEventHub(kvEvents, slots, cfg.WatchHistory, watchHistoryBytes)
	s.lockWatches = newLockFeed(slots, cfg.Clock, cfg.WatchHistory)
	s.fsm = fsm.New(observer{s})
	s.console = newConsole(s)
	s.metrics = newMetrics(s)
	s.streams = &opstream.Streams{
		Run:      s.runStreamOp,
		Workers:  apinet.NewWorkers(s.done),
		Silence:  framedSilence,
		MaxOps:   cfg.MaxStreamOps,
		Opens:    s.metrics.streamOpens,
		Open:     s.metrics.streams,
		Requests: s.metrics.streamRequests,
		Logger:   logger,
	}
	s.tracker = newSessionTracker(cfg.Clock, logger, s.expireSessions)
	s.limiter = newSessionLimiter(cfg.Clock)
	s.delays = newDelayScheduler(cfg.Clock, logger, s.liftDelay)
	return s
}

// listen opens the API's listener (and the metrics' one, with
// --listen-metrics), bounded by the connection limit.
func (s *Server) listen() error {
	cfg := s.cfg
	var err error
	if s.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listening on %s: %w", cfg.Listen, err)
	}
	s.ln = apinet.ReadAheadListener{Listener: s.ln}
	if cfg.ListenMetrics != "" {
		if s.metricsLn, err = net.Listen("tcp", cfg.ListenMetrics); err != nil {
			return fmt.Errorf("listening for metrics on %s: %w", cfg.ListenMetrics, err)
		}
	}
	nofile, known := openFileLimit()
	if limit := apinet.ConnLimit(cfg.MaxConnections, nofile, known); limit > 0 {
		s.conns = apinet.NewLimitListener(s.ln, limit)
		s.ln = s.conns
	}
	s.advertise = cfg.Advertise
	if s.advertise == "" {
		s.advertise = s.ln.Addr().String()
	}
	return nil
}

// serve starts serving the API and the node's background loops.
func (s *Server) serve() {
	s.confirmer = newLeaseConfirmer(s.node.confirmLeadership)
	s.live = &liveness{check: s.checkLoops}
	s.forwarder = newForwarder(s, s.handler())
	api := apinet.BoundWrites(s.checkCluster(s.forwarder), s.cfg.WriteTimeout)
	s.api.Store(&api)
	s.http = s.newHTTPServer(api)
	s.wg.Add(6)
	go s.watchDisk()
	go s.watchLeadership()
	go s.watchLeaderChanges()
	go s.watchPeersBack()
	go s.serveHTTP()
	if s.metricsLn != nil {
		s.metricsHTTP = s.newMetricsServer()
		s.wg.Add(1)
		go s.serveMetrics(s.metricsLn)
	}
	go s.registerLoop(500 * time.Millisecond)
}

// maxConnections returns how many API connections may be open at once;
// 0 means no limit.
func (s *Server) maxConnections() int {
	if s.conns == nil {
		return 0
	}
	return s.conns.Limit()
}

// Addr returns the address the API listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// MetricsAddr returns the address /metrics and the probes are served on
// over plain HTTP (Config.ListenMetrics), or "" when there is none.
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}

// RaftAddr returns the address raft listens on.
func (s *Server) RaftAddr() string { return string(s.node.transport.LocalAddr()) }

// Shutdown is a graceful Close, for SIGTERM: when this node leads a group
// with other voters, it first hands leadership to the most up-to-date of
// them (raft's LeadershipTransfer) and waits until another node leads, so
// that a rolling restart costs the group a round of TimeoutNow and one
// election instead of an election timeout. The hand-off is bounded by ctx
// and by raft's own bound (an election timeout); if it fails or ctx ends
// first, the node closes anyway and the others elect a leader as after a
// crash. It then closes the node as Close does.
func (s *Server) Shutdown(ctx context.Context) error {
	s.handOffLeadership(ctx)
	return s.Close()
}

// handOffLeadership transfers leadership away from this node, if it leads
// a group, and waits until another node leads, or ctx ends.
func (s *Server) handOffLeadership(ctx context.Context) {
	if !s.node.isLeader() || s.node.soleVoter() {
		return
	}
	start := time.Now()
	s.node.raftLog.handingOff.Store(true)
	future := s.node.raft.LeadershipTransfer()
	done := make(chan error, 1)
	go func() { done <- future.Error() }()
	select {
	case err := <-done:
		if err != nil {
			s.logger.Warn("handing over leadership failed; closing anyway", "err", err)
			return
		}
	case <-ctx.Done():
		s.logger.Warn("handing over leadership took too long; closing anyway", "after", time.Since(start))
		return
	}
	for {
		if _, id := s.node.raft.LeaderWithID(); id != "" && id != s.node.id {
			s.logger.Info("leadership handed over", "to", id, "took", time.Since(start))
			return
		}
		select {
		case <-ctx.Done():
			s.logger.Warn("leadership was given up, but no new leader was heard of before closing", "after", time.Since(start))
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Close stops serving, fails blocked calls with Unavailable, shuts raft down
// and closes the data files. It is safe to call more than once, and on a
// node never started, or whose Start failed.
func (s *Server) Close() error {
	s.lifeMu.Lock()
	switch s.life {
	case lifeNew, lifeOver:
		s.life = lifeOver
		s.lifeMu.Unlock()
		return nil // nothing was opened, or a failed Start closed it
	}
	s.life = lifeClosed
	s.lifeMu.Unlock()
	s.closeOnce.Do(func() {
		s.api.Store(nil)
		close(s.done)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errs := []error{s.http.Shutdown(ctx)}
		if s.metricsHTTP != nil {
			errs = append(errs, s.metricsHTTP.Shutdown(ctx))
		}
		s.upgrades.Close(ctx)
		s.forwarder.close()
		s.tracker.stop()
		s.delays.becomeFollower()
		errs = append(errs, s.node.close())
		s.wg.Wait()
		errs = append(errs, s.dirLock.Unlock())
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// Handler returns the node's API as an http.Handler, for a program that
// serves it on an HTTP server of its own, beside its own routes: every
// service (gRPC, Connect, JSON over HTTP), the session stream, gRPC's
// health and reflection services, /metrics, the probes and the console,
// as the node serves them on its Listen port, which stays open. Mount it
// at the root of the paths (gRPC's are /package.Service/Method). The
// program's server must speak HTTP/2 for gRPC: over cleartext, set
// http.Protocols' UnencryptedHTTP2. What fence sets on its own port is
// then the program's to set: the connection limit, the timeouts (Config's
// ReadTimeout and IdleTimeout), TLS and client certificates (the node
// reads a verified client certificate's identity from the request, for
// auth), and the bound on a connection's session-stream operations
// (MaxStreamOps) holds per stream. Before Start and after Close the
// handler answers 503 (a client takes it for Unavailable, and tries
// another node). Close does not wait for calls in flight through the
// handler, as it does for those on the node's port: they end Unavailable.
// Shut your server down first for a clean stop.
func (s *Server) Handler() http.Handler { return apiHandler{s} }

// apiHandler serves the node's API while it runs.
type apiHandler struct{ s *Server }

func (h apiHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	api := h.s.api.Load()
	if api == nil {
		http.Error(w, "fence: the node is not running (not started yet, or closed)", http.StatusServiceUnavailable)
		return
	}
	(*api).ServeHTTP(w, r)
}

// handler is the API's mux and the checks in front of it, behind the
// forwarder.
func (s *Server) handler() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithReadMaxBytes(s.cfg.MaxRequestBytes),
		connect.WithCodec(apinet.StrictJSON{}),
		// Small messages cost more to gzip than to send: compressing every
		// response took 15% of the CPU under load.
		connect.WithCompressMinBytes(4096),
		connect.WithInterceptors(s.metrics.interceptor(), errorInterceptor{hint: s.leaderHint}, authInterceptor{s}),
		connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
			s.logger.Error("handler panicked", "procedure", spec.Procedure, "panic", p)
			return connect.NewError(connect.CodeInternal, fmt.Errorf("internal error in %s", spec.Procedure))
		}),
	}
	mux := http.NewServeMux()
	a := handlers{Server: s}
	for _, o := range operations {
		mux.Handle(o.unary(s, opts))
	}
	mux.Handle(fencev1connect.NewSessionServiceHandler(a, opts...))
	mux.Handle(fencev1connect.NewLockServiceHandler(lockService{a}, opts...))
	mux.Handle(fencev1connect.NewKVServiceHandler(a, opts...))
	mux.Handle(fencev1connect.NewClusterServiceHandler(a, opts...))
	mux.Handle(fencev1connect.NewAuthServiceHandler(a, opts...))
	streamPath, stream := fencev1connect.NewStreamServiceHandler(a, opts...)
	mux.Handle(streamPath, opstream.LongReads(stream))
	// The standard gRPC health service (Kubernetes gRPC probes,
	// grpc-health-probe) and server reflection (grpcurl, Postman).
	mux.Handle(grpchealth.NewHandler(healthChecker{s}))
	reflector := grpcreflect.NewStaticReflector(apiServices...)
	mux.Handle(grpcreflect.NewHandlerV1(reflector))
	mux.Handle(grpcreflect.NewHandlerV1Alpha(reflector))
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
	if s.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	}
	s.addProbes(mux)
	if s.cfg.UI {
		s.console.register(mux)
	}
	return withCertUser(s.framedStreams(explainRefusals(apinet.CheckEnvelopes(mux, s.cfg.MaxRequestBytes, fenceServices))))
}

// newHTTPServer makes the server of the node's API port, serving api.
func (s *Server) newHTTPServer(api http.Handler) *http.Server {
	var protocols http.Protocols
	protocols.SetHTTP1(true)
	if s.cfg.TLS != nil {
		protocols.SetHTTP2(true)
	} else {
		protocols.SetUnencryptedHTTP2(true) // gRPC without TLS
	}
	return &http.Server{
		Handler:     api,
		Protocols:   &protocols,
		TLSConfig:   s.cfg.TLS,
		ConnContext: s.streams.ConnContext,
		// ReadTimeout bounds the headers and the body, not the answer: over
		// HTTP/1.1 net/http clears the connection's read deadline once the
		// body has been read to its end, and over HTTP/2 the timeout ends
		// only the stream's body. A body that does not arrive in time fails
		// the call, and an HTTP/1.1 connection is then closed, as the rest
		// of the body cannot be told from a next request. Blocked acquires
		// and watches are long answers, so there is no WriteTimeout: each
		// write is bounded instead (apinet.BoundWrites).
		ReadHeaderTimeout: s.cfg.ReadTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		HTTP2: &http.HTTP2Config{
			// A client that stops answering pings while its streams are
			// open (a host gone, a process stopped) is dropped within
			// 45s, not when TCP keepalive gives up minutes later.
			SendPingTimeout: 30 * time.Second,
			PingTimeout:     15 * time.Second,
		},
		ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
}

func (s *Server) serveHTTP() {
	defer s.wg.Done()
	serve := s.http.Serve
	if s.cfg.TLS != nil {
		// The certificates come from TLSConfig; ServeTLS adds HTTP/2's ALPN.
		serve = func(ln net.Listener) error { return s.http.ServeTLS(ln, "", "") }
	}
	if err := serve(s.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.logger.Error("API server stopped", "err", err)
	}
}

// watchLeadership starts and stops the leader's duties: session expiry,
// lock-delays, and blocked waits (which fail over to the new leader).
func (s *Server) watchLeadership() {
	defer s.wg.Done()
	ch := s.node.raft.LeaderCh()
	for {
		select {
		case <-s.done:
			return
		case leader := <-ch:
			if !leader || s.leaderReady.Load() {
				// raft's notice that leadership was lost is dropped when
				// it is won again before this loop reads it: the duties
				// of the term that ended end all the same.
				s.stopLeading()
			}
			if leader {
				s.becomeLeader()
			}
		}
	}
}

// stopLeading ends the leader's duties of the term that ended: waits,
// keepalives and streams of that term fail over to the new leader.
func (s *Server) stopLeading() {
	s.logger.Info("lost leadership")
	s.leaderReady.Store(false)
	s.leaderTerm.over()
	s.tracker.becomeFollower()
	s.delays.becomeFollower()
	s.hub.failAll(fmt.Errorf("%w: this node lost leadership; retry against the new leader", fence.ErrUnavailable))
}

func (s *Server) becomeLeader() {
	// Apply everything committed in earlier terms before taking decisions.
	term := s.node.raft.CurrentTerm()
	for {
		err := s.prepareToLead()
		if err == nil {
			break
		}
		s.logger.Warn("preparing to lead failed", "err", err)
		if !s.node.isLeader() {
			return
		}
		select {
		case <-s.done:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	if !s.node.isLeader() || s.node.raft.CurrentTerm() != term {
		// Lost in the meantime: the notice of that is on its way, and a
		// leadership won again since comes with a notice of its own.
		s.logger.Info("lost leadership before it was ready", "term", term)
		return
	}
	var delayed []fsm.Delay
	s.fsm.Read(func(st *fsm.State) { delayed = st.DelayedLocks() })
	s.tracker.becomeLeader()
	s.delays.becomeLeader(delayed)
	s.leaderTerm.begin()
	s.leaderReady.Store(true)
	s.logger.Info("became leader", "node", s.cfg.NodeID)
	s.registerSelf()
	if len(s.members()) == 1 {
		s.registerMembers() // agrees the group's protocol now; a group's waits for the loop
	}
}

// prepareToLead applies every entry committed in earlier terms (a barrier
// in this term), names the group if it has no id yet, then lifts the token
// floor to this node's reserve, so that no token it grants is one a damaged
// log made it forget.
func (s *Server) prepareToLead() error {
	if err := s.node.await(s.node.raft.Barrier(s.cfg.ApplyTimeout)); err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	if err := s.agreeFoundingProtocol(); err != nil {
		return err
	}
	if err := s.nameCluster(); err != nil {
		return err
	}
	var last uint64
	s.fsm.Read(func(st *fsm.State) { last = st.LastToken() })
	floor := s.reserve.Floor()
	if last >= floor {
		return nil
	}
	if _, _, err := s.node.propose(&fsmpb.Command{Op: &fsmpb.Command_RaiseTokens{RaiseTokens: &fsmpb.RaiseTokens{Floor: floor}}}); err != nil {
		return fmt.Errorf("raising the token floor to %d: %w", floor, err)
	}
	s.logger.Info("token floor raised to this node's reserve", "last_token", last, "floor", floor)
	return nil
}

// Failed is closed when the node stops by itself, for a failure that Err
// then returns: its state machine met a log entry it does not understand
// (written by a newer version of fence). The node has closed, or is
// closing; a program serving it should exit with the error.
func (s *Server) Failed() <-chan struct{} { return s.failed }

// Err returns why the node stopped by itself, once Failed is closed; nil
// before.
func (s *Server) Err() error {
	select {
	case <-s.failed:
		return s.failReason
	default:
		return nil
	}
}

// fail stops the node for err, once.
func (s *Server) fail(err error) {
	s.failOnce.Do(func() {
		s.logger.Error("node stopped", "err", err)
		s.failReason = err
		close(s.failed)
		go s.Close() // not from raft's goroutines: Close waits for them
	})
}

// problems says what is wrong with this node, one line each: a disk found
// full by the raft log or by the token reserve, a group not bootstrapped.
func (s *Server) problems() []string {
	var out []string
	if note := s.bootstrapNote.Load(); note != nil {
		out = append(out, "not bootstrapped: "+*note)
	} else if s.ident.rejoining.Load() {
		out = append(out, "rejoining its group: its data dir was lost; it is removed and added again as a new member, and votes once it has caught up")
	}
	if s.node != nil {
		if p := s.node.problem(); p != "" {
			out = append(out, p)
		}
	}
	if s.reserve != nil {
		if p := s.reserve.Problem(); p != "" {
			out = append(out, p)
		}
	}
	if s.node != nil {
		if p := s.diskProblem(); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (s *Server) expireSessions(ids []uint64) error {
	res, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_ExpireSessions{ExpireSessions: &fsmpb.ExpireSessions{SessionIds: ids}}})
	if err == nil {
		s.logger.Info("sessions expired", "sessions", res.Effects.Ended)
		s.metrics.expired.Add(float64(len(res.Effects.Ended)))
	}
	return err
}

func (s *Server) liftDelay(lock string, id uint64) error {
	_, err := s.apply(&fsmpb.Command{Op: &fsmpb.Command_LiftDelay{LiftDelay: &fsmpb.LiftDelay{Lock: lock, Id: id}}})
	return err
}

// apiServices are the gRPC services of the API.
var apiServices = []string{
	fencev1connect.SessionServiceName, fencev1connect.LockServiceName,
	fencev1connect.KVServiceName, fencev1connect.ClusterServiceName,
	fencev1connect.AuthServiceName, fencev1connect.StreamServiceName,
}

// healthChecker answers the gRPC health service: a node is serving while
// it knows a leader, for the whole server ("") and for each fence service.
type healthChecker struct{ s *Server }

func (h healthChecker) Check(_ context.Context, req *grpchealth.CheckRequest) (*grpchealth.CheckResponse, error) {
	if req.Service != "" && !slices.Contains(apiServices, req.Service) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("unknown service %q", req.Service))
	}
	if _, id := h.s.node.raft.LeaderWithID(); id == "" {
		return &grpchealth.CheckResponse{Status: grpchealth.StatusNotServing}, nil
	}
	return &grpchealth.CheckResponse{Status: grpchealth.StatusServing}, nil
}

// observer routes the FSM's effects to the parts of the server that act on
// them. It runs on raft's apply goroutine; it blocks that goroutine only in
// coverTokens, until the token reserve on disk covers a new grant.
type observer struct{ s *Server }

func (o observer) Applied(seq fsm.Seq, eff fsm.Effects) {
	s := o.s
	if n := len(eff.Grants); n > 0 && !s.coverTokens(eff.Grants[n-1].Token) {
		return
	}
	if s.ident.groupID() == "" {
		s.learnGroup()
	}
	// A node added to its group learned the group when it was admitted
	// (admit.go), before it held a byte of its data: it records that it
	// holds the group's data once it applies an entry of it (once; after
	// that an atomic load).
	s.noteHeldData()
	if id := eff.Created; id != 0 {
		var ttl time.Duration
		s.fsm.Read(func(st *fsm.State) {
			info, _ := st.Session(id)
			ttl = info.TTL
		})
		s.tracker.created(id, ttl)
	}
	for _, id := range eff.Ended {
		s.tracker.ended(id)
	}
	s.hub.applied(uint64(seq), eff)
	if n := len(eff.Events); n > 0 {
		s.watches.publish(eff.Events, eff.Events[n-1].KV.ModRevision)
	}
	s.console.record(s.lockWatches.applied(seq, eff.LockEvents))
	s.delays.schedule(eff.Delayed)
	s.metrics.grants.Add(float64(len(eff.Grants)))
	if eff.AuthChanged {
		s.authChanges.notify()
	}
}

// coverTokens returns once the token reserve covers token. It runs on
// raft's apply goroutine, before anyone is answered the grant, and holds
// the node's applying until the reserve is written: a node that cannot
// write it must not hand out tokens past it. It reports false if the node
// shut down first.
func (s *Server) coverTokens(token uint64) bool {
	for {
		err := s.reserve.Cover(token)
		if err == nil {
			return true
		}
		s.logger.Error("cannot write the token reserve; no grant is answered until it is written", "err", err)
		select {
		case <-s.done:
			return false
		case <-time.After(time.Second):
		}
	}
}

// Halted stops the node: its state machine cannot go on without skipping
// an entry.
func (o observer) Halted(err error) { o.s.fail(err) }

func (o observer) Restored() {
	s := o.s
	s.restores.Add(1)
	s.cluster.forget()
	s.learnGroup()
	var last uint64
	s.fsm.Read(func(st *fsm.State) { last = st.LastToken() })
	s.coverTokens(last)
	var sessions []fsm.SessionInfo
	s.fsm.Read(func(st *fsm.State) { sessions = st.Sessions() })
	s.tracker.reset(sessions)
	s.hub.restored(s.fsm.Read)
	var rev uint64
	s.fsm.Read(func(st *fsm.State) { rev = st.KVRevision() })
	// The watchers' streams would jump over the changes the snapshot
	// stands for: end them, so that clients resume (and learn that the
	// changes are compacted) rather than miss them unawares.
	s.watches.reset(rev, errReplaced)
	s.lockWatches.restored(s.snapshotOpened.Load())
	s.authChanges.notify()
}

// errorInterceptor maps the handlers' errors to Connect codes with
// details, naming the leader's API address on Unavailable.
type errorInterceptor struct{ hint func(error) error }

func (i errorInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		return resp, rpcerr.ToConnect(i.hint(err))
	}
}

func (i errorInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (i errorInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		return rpcerr.ToConnect(i.hint(next(ctx, conn)))
	}
}

// metrics are served on /metrics, one registry per server.
type metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	grants   prometheus.Counter
	expired  prometheus.Counter
	// streams counts the session streams open; streamRequests the
	// messages they carried, by operation.
	streams        prometheus.Gauge
	streamOpens    *prometheus.CounterVec
	streamRequests *prometheus.CounterVec
	// storage and leaderChanges, and the rest of registerOpsMetrics.
	storage       *storageMetrics
	leaderChanges prometheus.Counter
}

func newMetrics(s *Server) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_requests_total", Help: "API requests by procedure and result code.",
		}, []string{"procedure", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fence_request_seconds", Help: "API request latency by procedure (Acquire includes waiting).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"procedure"}),
		grants:  prometheus.NewCounter(prometheus.CounterOpts{Name: "fence_grants_total", Help: "Lock grants applied, hand-offs included."}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Name: "fence_sessions_expired_total", Help: "Sessions expired by this node as leader."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fence_streams", Help: "Session streams open (StreamService.Session)."}),
		streamOpens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_stream_opens_total", Help: "Session streams opened, by transport: framed on the connection, or HTTP/2 (Connect, gRPC).",
		}, []string{"transport"}),
		streamRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fence_stream_requests_total", Help: "Messages received on session streams, by operation (a keep_alive message renews many sessions).",
		}, []string{"op"}),
	}
	gauge := func(name, help string, read func(st *fsm.State) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			var v float64
			s.fsm.Read(func(st *fsm.State) { v = read(st) })
			return v
		})
	}
	m.registry.MustRegister(m.requests, m.latency, m.grants, m.expired, m.streams, m.streamOpens, m.streamRequests,
		gauge("fence_sessions", "Live sessions.", func(st *fsm.State) float64 { return float64(st.NumSessions()) }),
		gauge("fence_locks", "Locks held, waited for or delayed.", func(st *fsm.State) float64 { return float64(st.NumLocks()) }),
		gauge("fence_last_token", "The last fencing token issued.", func(st *fsm.State) float64 { return float64(st.LastToken()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fence_disk_full", Help: "1 while the last write to the raft log or the token reserve found no space."}, func() float64 {
			return boolGauge(s.node.log != nil && s.node.log.Full() || s.reserve != nil && s.reserve.Full())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fence_disk_low", Help: "1 while the data dir's disk has less free space than --min-free-disk, or is full."}, func() float64 {
			return boolGauge(s.node.lowDisk.Load())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fence_api_connections", Help: "API connections open; new ones wait while this is at fence_api_connections_max."}, func() float64 {
			if s.conns == nil {
				return 0
			}
			return float64(s.conns.Open())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fence_api_connections_max", Help: "API connections that may be open at once (0: no limit)."}, func() float64 {
			return float64(s.maxConnections())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fence_is_leader", Help: "1 if this node is the raft leader."}, func() float64 {
			if s.node != nil && s.node.isLeader() {
				return 1
			}
			return 0
		}),
	)
	registerOpsMetrics(s, m)
	return m
}

func (m *metrics) interceptor() connect.Interceptor {
	return connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			start := time.Now()
			resp, err := next(ctx, req)
			var code connect.Code
			if err != nil {
				code = connect.CodeOf(err)
			}
			m.observe(req.Spec().Procedure, start, code)
			return resp, err
		}
	})
}

// observe counts one call of procedure, or one operation of a session
// stream under its unary call's procedure, that started at start and
// ended with code (0: it succeeded).
func (m *metrics) observe(procedure string, start time.Time, code connect.Code) {
	m.observeN(procedure, start, code, 1)
}

// observeN is observe for n operations alike (the sessions of one
// keepalive), with one lookup of the labels.
func (m *metrics) observeN(procedure string, start time.Time, code connect.Code, n int) {
	if n == 0 {
		return
	}
	latency, took := m.latency.WithLabelValues(procedure), time.Since(start).Seconds()
	for range n {
		latency.Observe(took)
	}
	label := "ok"
	if code != 0 {
		label = code.String()
	}
	m.requests.WithLabelValues(procedure, label).Add(float64(n))
}

// WaitLeader blocks until this node can serve: it is the leader and has
// applied its log, or it knows another node leads. It gives up when ctx
// ends (fence.ErrUnavailable, wrapping ctx's cause) or the node fails (Err).
func (s *Server) WaitLeader(ctx context.Context) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if s.leaderReady.Load() {
			return nil
		}
		if _, id := s.node.raft.LeaderWithID(); id != "" && string(id) != s.cfg.NodeID {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: no leader ready: %w", fence.ErrUnavailable, context.Cause(ctx))
		case <-s.Failed():
			return s.Err()
		case <-tick.C:
		}
	}
}

// boolGauge is a gauge's value for b: 1 for true.
func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

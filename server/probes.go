package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fencelock/fence/internal/fsm"
)

// Probes, on the API port and on Config.ListenMetrics (docs/design.md,
// Probes and metrics):
//
//   - /healthz: 200 while the node knows a leader (as the gRPC health
//     service answers).
//   - /livez: 200 while the process runs and its main loops answer: raft's
//     main loop, and the state machine's lock, which the apply path holds.
//     A node that is alive but cut off from its group is live; a kubelet
//     restarting it would not help.
//   - /readyz: 200 only while the node can serve linearizable calls: it is
//     the leader and has applied every entry of earlier terms, or it heard
//     from the leader within half a heartbeat timeout; and it has applied
//     up to the commit index it saw when the probe arrived. Otherwise 503
//     with the reason in the body.

// probeTimeout bounds how long /livez waits for the main loops, and
// readyWait how long /readyz waits for the applied index to reach the
// commit index seen on arrival (under load it trails by a few entries).
const (
	probeTimeout = 5 * time.Second
	readyWait    = time.Second
)

// addProbes adds /healthz, /livez and /readyz to mux.
func (s *Server) addProbes(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if _, id := s.node.raft.LeaderWithID(); id == "" {
			http.Error(w, "no leader", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/livez", func(w http.ResponseWriter, r *http.Request) {
		if err := s.live.probe(r.Context(), probeTimeout); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.ready(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
}

// ready reports why this node cannot serve linearizable calls now, or nil.
func (s *Server) ready(ctx context.Context) error {
	select {
	case <-s.done:
		return errors.New("shutting down")
	default:
	}
	r := s.node.raft
	switch st := r.State(); st {
	case raft.Shutdown:
		return errors.New("shutting down")
	case raft.Leader:
		if !s.leaderReady.Load() {
			return errors.New("leader, still applying the entries of earlier terms")
		}
	default:
		if _, id := s.node.leader(); id == "" {
			return fmt.Errorf("%s with no leader heard from within %v", st, s.cfg.HeartbeatTimeout/2)
		}
	}
	commit := r.CommitIndex()
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	for r.AppliedIndex() < commit {
		select {
		case <-ctx.Done():
			return fmt.Errorf("applied index %d is behind the commit index %d", r.AppliedIndex(), commit)
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// checkLoops returns once raft's main loop has answered a request and the
// state machine's lock could be taken. VerifyLeader is answered by the main
// loop in every state: at once by a follower or candidate, and by a leader
// once a quorum answered or its lease ran out.
func (s *Server) checkLoops() error {
	err := s.node.raft.VerifyLeader().Error()
	if errors.Is(err, raft.ErrRaftShutdown) {
		return errors.New("raft is shut down")
	}
	s.fsm.Read(func(*fsm.State) {})
	return nil
}

// liveness runs one check of the main loops at a time, however many probes
// ask: a wedged loop holds one goroutine, not one per probe.
type liveness struct {
	check func() error

	mu      sync.Mutex
	running chan struct{} // closed when the check under way returns
	since   time.Time     // when it began
	err     error         // the last finished check's
}

func (l *liveness) probe(ctx context.Context, timeout time.Duration) error {
	l.mu.Lock()
	if l.running == nil {
		done := make(chan struct{})
		l.running, l.since = done, time.Now()
		go func() {
			err := l.check()
			l.mu.Lock()
			l.err, l.running = err, nil
			l.mu.Unlock()
			close(done)
		}()
	}
	done, since := l.running, l.since
	l.mu.Unlock()
	t := time.NewTimer(timeout - time.Since(since))
	defer t.Stop()
	select {
	case <-done:
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.err
	case <-t.C:
		return fmt.Errorf("the raft main loop or the state machine has not answered for %v", time.Since(since).Round(time.Millisecond))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// newMetricsServer serves /metrics and the probes over plain HTTP on
// cfg.ListenMetrics, beside an API that may require client certificates.
func (s *Server) newMetricsServer() *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.registry, promhttp.HandlerOpts{}))
	s.addProbes(mux)
	return &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: s.cfg.ReadTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       s.cfg.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
	}
}

func (s *Server) serveMetrics(ln net.Listener) {
	defer s.wg.Done()
	if err := s.metricsHTTP.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		s.logger.Error("metrics server stopped", "err", err)
	}
}

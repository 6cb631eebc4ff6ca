package server

import (
	"fmt"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fencelock/fence/internal/buildinfo"
	"github.com/fencelock/fence/internal/fsm"
)

// The metrics an operator needs beside the API's own (docs/design.md,
// Probes and metrics): raft's state and its own measurements, proposals,
// the disk, the state machine's size, and the build.

// storageMetrics are measured by the node: the time to commit a proposal,
// failed proposals, and the time to append (and fsync) a batch to the log.
type storageMetrics struct {
	proposals       prometheus.Histogram
	proposalsFailed prometheus.Counter
	logAppend       prometheus.Histogram
}

func (m *storageMetrics) proposed(start time.Time, err error) {
	if m == nil {
		return
	}
	m.proposals.Observe(time.Since(start).Seconds())
	if err != nil {
		m.proposalsFailed.Inc()
	}
}

// waiterBuckets bound the distribution of queue lengths: how many locks
// have at most 0, 1, 2, ... waiters. A label per lock name would grow
// without bound.
var waiterBuckets = []float64{0, 1, 2, 5, 10, 50, 100, 1000, 10000}

// registerOpsMetrics adds the operator's metrics to m.registry.
func registerOpsMetrics(s *Server, m *metrics) {
	m.storage = &storageMetrics{
		proposals: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fence_proposal_seconds", Help: "Time from proposing a command to raft to its result on the leader (commit on a quorum, then apply).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		proposalsFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fence_proposals_failed_total", Help: "Proposals that raft did not commit (lost leadership, timeout, disk full, shutdown).",
		}),
		logAppend: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fence_disk_log_append_seconds", Help: "Time to append a batch of entries to the raft log, its fsync included (etcd's wal_fsync_duration).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}),
	}
	m.leaderChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fence_leader_changes_seen_total", Help: "Leaders this node has seen elected (a new leader, or the same node in a new term), the first included.",
	})
	info := buildinfo.Read()
	buildInfo := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fence_build_info", Help: "1, labelled with the node's version, VCS revision and Go version.",
		ConstLabels: prometheus.Labels{"version": s.cfg.Version, "revision": info.Revision, "goversion": info.GoVersion},
	})
	buildInfo.Set(1)
	raftGauge := func(name, help string, read func(r *raft.Raft) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			if s.node == nil || s.node.raft == nil {
				return 0
			}
			return read(s.node.raft)
		})
	}
	stateGauge := func(name, help string, read func(st *fsm.State) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 {
			var v float64
			s.fsm.Read(func(st *fsm.State) { v = read(st) })
			return v
		})
	}
	m.registry.MustRegister(
		m.storage.proposals, m.storage.proposalsFailed, m.storage.logAppend, m.leaderChanges, buildInfo,
		raftGauge("fence_has_leader", "1 if this node knows a leader it heard from within half a heartbeat timeout (or leads).", func(*raft.Raft) float64 {
			if _, id := s.node.leader(); id != "" {
				return 1
			}
			return 0
		}),
		raftGauge("fence_raft_term", "This node's current raft term.", func(r *raft.Raft) float64 { return float64(r.CurrentTerm()) }),
		raftGauge("fence_raft_commit_index", "The highest raft log index this node knows committed.", func(r *raft.Raft) float64 { return float64(r.CommitIndex()) }),
		raftGauge("fence_raft_applied_index", "The highest raft log index handed to the state machine.", func(r *raft.Raft) float64 { return float64(r.AppliedIndex()) }),
		raftGauge("fence_raft_last_index", "The last raft log index stored on this node.", func(r *raft.Raft) float64 { return float64(r.LastIndex()) }),
		stateGauge("fence_kv_keys", "Live keys in the fenced KV store.", func(st *fsm.State) float64 { return float64(st.NumKeys()) }),
		stateGauge("fence_kv_bytes", "Bytes of the live keys' names and values in the fenced KV store.", func(st *fsm.State) float64 { return float64(st.KVBytes()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fence_watchers", Help: "KV watches open on this node."}, func() float64 {
			return float64(s.watches.count())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "fence_lock_watchers", Help: "Lock watches (LockService.Watch) open on this node."}, func() float64 {
			return float64(s.lockWatches.count())
		}),
		waitersCollector{s},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	if sink, err := raftMetricsSink(); err != nil {
		s.logger.Warn("raft's own metrics are not exported", "err", err)
	} else {
		m.registry.MustRegister(sink)
	}
}

// waitersCollector exports the distribution of waiters per lock as a
// histogram, and the total, read from the state at each scrape.
type waitersCollector struct{ s *Server }

var (
	waitersDesc = prometheus.NewDesc("fence_lock_waiters", "Locks by their number of waiters (held, waited for or delayed locks only; a histogram, not a label per lock).", nil, nil)
	waitingDesc = prometheus.NewDesc("fence_waiters", "Acquires waiting in a lock's queue, in all.", nil, nil)
)

func (c waitersCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- waitersDesc
	ch <- waitingDesc
}

func (c waitersCollector) Collect(ch chan<- prometheus.Metric) {
	counts := make([]uint64, len(waiterBuckets))
	var locks, sum uint64
	c.s.fsm.Read(func(st *fsm.State) {
		st.EachQueue(func(n int) {
			locks++
			sum += uint64(n)
			for i, b := range waiterBuckets {
				if float64(n) <= b {
					counts[i]++
				}
			}
		})
	})
	buckets := make(map[float64]uint64, len(waiterBuckets))
	for i, b := range waiterBuckets {
		buckets[b] = counts[i]
	}
	ch <- prometheus.MustNewConstHistogram(waitersDesc, locks, float64(sum), buckets)
	ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(sum))
}

// raft and its stores report through hashicorp/go-metrics, a process-wide
// global; one raftSink receives them, and every server's registry exports
// it (several nodes in one process, as in tests, share it). Names are
// raft's keys under fence_: fence_raft_commitTime, timers in milliseconds
// as histograms.
var raftSinkOnce struct {
	once sync.Once
	sink *raftSink
	err  error
}

func raftMetricsSink() (prometheus.Collector, error) {
	raftSinkOnce.once.Do(func() {
		sink := newRaftSink()
		conf := gometrics.DefaultConfig("fence")
		conf.EnableHostname = false
		conf.EnableRuntimeMetrics = false // the Go collector has them
		if _, err := gometrics.NewGlobal(conf, sink); err != nil {
			raftSinkOnce.err = fmt.Errorf("raft metrics: %w", err)
			return
		}
		raftSinkOnce.sink = sink
	})
	if raftSinkOnce.err != nil {
		return nil, raftSinkOnce.err // not a nil *raftSink in a Collector
	}
	return raftSinkOnce.sink, nil
}

// watchLeaderChanges counts the leaders this node sees elected, until the
// server closes.
func (s *Server) watchLeaderChanges() {
	defer s.wg.Done()
	ch, stop := observeRaft[raft.LeaderObservation](s.node.raft)
	defer stop()
	var lastID raft.ServerID
	var lastTerm uint64
	seen := func(id raft.ServerID) {
		term := s.node.raft.CurrentTerm()
		if id != "" && (id != lastID || term != lastTerm) {
			s.metrics.leaderChanges.Inc()
			lastID, lastTerm = id, term
		}
	}
	_, id := s.node.raft.LeaderWithID() // elected before the observer was registered
	seen(id)
	for {
		select {
		case <-s.done:
			return
		case o := <-ch:
			seen(o.Data.(raft.LeaderObservation).LeaderID)
		}
	}
}

package server

import (
	"strings"
	"sync"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"
)

// raftSink keeps what raft and its stores measure through
// hashicorp/go-metrics as Prometheus metrics, named after the key under
// fence_ (fence_raft_commitTime): gauges, counters, and timers (in
// milliseconds) as histograms.
//
// It replaces go-metrics' own Prometheus sink, which for each sample
// joined and rewrote the key, copied and stored an entry in a sync.Map,
// read the clock, and fed a summary whose quantiles are kept over sliding
// windows: 591 ns and 4 allocations a sample (BenchmarkRaftSinkSample),
// several samples an operation on every node, 5-10% of a follower's CPU
// in profiles of a 3-node group under fence bench. Here a sample is a map
// lookup under a read lock, on a key built in a buffer on the stack, and
// a histogram's atomic add: 64 ns, no allocation, and each node's resident
// memory about 4 MiB lower. Histograms, unlike summaries, also add up
// across nodes.
type raftSink struct {
	mu      sync.RWMutex
	metrics map[string]prometheus.Collector // by sinkKey
}

func newRaftSink() *raftSink {
	return &raftSink{metrics: map[string]prometheus.Collector{}}
}

var _ gometrics.MetricSink = (*raftSink)(nil)

// raftTimerBuckets bound raft's timers, in milliseconds: from a fast
// fsync to a slow snapshot.
var raftTimerBuckets = []float64{0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}

// SetGauge sets the gauge key.
func (s *raftSink) SetGauge(key []string, val float32) { s.SetGaugeWithLabels(key, val, nil) }

// SetGaugeWithLabels sets the gauge key with labels.
func (s *raftSink) SetGaugeWithLabels(key []string, val float32, labels []gometrics.Label) {
	if g, ok := s.metric(key, labels, newRaftGauge).(prometheus.Gauge); ok {
		g.Set(float64(val))
	}
}

// EmitKey is a one-off value, which Prometheus has no type for: dropped,
// as go-metrics' own Prometheus sink drops it.
func (s *raftSink) EmitKey([]string, float32) {}

// IncrCounter adds val to the counter key.
func (s *raftSink) IncrCounter(key []string, val float32) { s.IncrCounterWithLabels(key, val, nil) }

// IncrCounterWithLabels adds val to the counter key with labels.
func (s *raftSink) IncrCounterWithLabels(key []string, val float32, labels []gometrics.Label) {
	if c, ok := s.metric(key, labels, newRaftCounter).(prometheus.Counter); ok && val >= 0 {
		c.Add(float64(val))
	}
}

// AddSample adds a sample, a timer's milliseconds, to the histogram key.
func (s *raftSink) AddSample(key []string, val float32) { s.AddSampleWithLabels(key, val, nil) }

// AddSampleWithLabels adds a sample to the histogram key with labels.
func (s *raftSink) AddSampleWithLabels(key []string, val float32, labels []gometrics.Label) {
	if h, ok := s.metric(key, labels, newRaftHistogram).(prometheus.Histogram); ok {
		h.Observe(float64(val))
	}
}

// metric returns the metric of key and labels, made by newMetric the
// first time. A key first used as another kind keeps that kind: the
// caller's type assertion fails, and the value is dropped.
func (s *raftSink) metric(key []string, labels []gometrics.Label, newMetric func(prometheus.Opts) prometheus.Collector) prometheus.Collector {
	var buf [160]byte
	k := sinkKey(buf[:0], key, labels)
	s.mu.RLock()
	m, ok := s.metrics[string(k)] // no allocation: the compiler looks up by the bytes
	s.mu.RUnlock()
	if ok {
		return m
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.metrics[string(k)]; ok {
		return m
	}
	name := metricName(key)
	opts := prometheus.Opts{Name: name, Help: "raft's measurement " + name + " (hashicorp/go-metrics)."}
	if len(labels) > 0 {
		opts.ConstLabels = prometheus.Labels{}
		for _, l := range labels {
			opts.ConstLabels[metricName([]string{l.Name})] = l.Value
		}
	}
	m = newMetric(opts)
	s.metrics[string(k)] = m
	return m
}

// sinkKey appends to b the metric's name and labels as Prometheus will
// know them (sanitized): keys that differ only in characters a name may
// not hold, as raft's per-peer keys for node ids "n-1" and "n.1" do, are
// one metric, as they were to go-metrics' own sink. Two metrics of one
// name would fail every scrape.
func sinkKey(b []byte, key []string, labels []gometrics.Label) []byte {
	for i, part := range key {
		if i > 0 {
			b = append(b, '_')
		}
		b = appendSanitized(b, part)
	}
	for _, l := range labels {
		b = append(b, ';')
		b = appendSanitized(b, l.Name)
		b = append(b, '=')
		b = append(b, l.Value...)
	}
	return b
}

// appendSanitized appends s to b, each character Prometheus does not
// allow in a name made '_'.
func appendSanitized(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; nameChar(c) {
			b = append(b, c)
		} else {
			b = append(b, '_')
		}
	}
	return b
}

func nameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == ':'
}

// metricName joins key with underscores, each character Prometheus does
// not allow in a name made one: the names go-metrics' own sink gave.
func metricName(key []string) string {
	return string(sinkKey(nil, key, nil))
}

func newRaftGauge(o prometheus.Opts) prometheus.Collector {
	return prometheus.NewGauge(prometheus.GaugeOpts(o))
}

func newRaftCounter(o prometheus.Opts) prometheus.Collector {
	return prometheus.NewCounter(prometheus.CounterOpts(o))
}

// raftShareBuckets bound the share of time one of raft's goroutines was
// busy (raft.thread.*.saturation), 0 to 1.
var raftShareBuckets = []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}

// raftBatchBuckets bound the entries the FSM applies in one batch
// (raft.fsm.applyBatchNum), or bbolt's log store writes in one
// (raft.boltdb.logsPerBatch).
var raftBatchBuckets = prometheus.ExponentialBuckets(1, 2, 11)

// raftByteBuckets bound the bytes of a log entry or a batch of them that
// bbolt's log store writes (raft.boltdb.logSize, logBatchSize): 64 B to
// 16 MiB.
var raftByteBuckets = prometheus.ExponentialBuckets(64, 4, 10)

// raftRateBuckets bound bbolt's log store's write capacity
// (raft.boltdb.writeCapacity), in entries a second.
var raftRateBuckets = prometheus.ExponentialBuckets(10, 4, 10)

// newRaftHistogram makes the histogram of one of raft's samples: most are
// timers, in milliseconds; a saturation, a batch's entries, bbolt's bytes
// and its write rate are not, and get buckets of their own.
func newRaftHistogram(o prometheus.Opts) prometheus.Collector {
	buckets, unit := raftTimerBuckets, " A timer's samples are milliseconds."
	switch {
	case strings.HasSuffix(o.Name, "_saturation"):
		buckets, unit = raftShareBuckets, " Its samples are the share of time the goroutine was busy, 0 to 1."
	case strings.HasSuffix(o.Name, "_applyBatchNum"), strings.HasSuffix(o.Name, "_logsPerBatch"):
		buckets, unit = raftBatchBuckets, " Its samples are the entries of a batch."
	case strings.HasSuffix(o.Name, "_logSize"), strings.HasSuffix(o.Name, "_logBatchSize"):
		buckets, unit = raftByteBuckets, " Its samples are bytes."
	case strings.HasSuffix(o.Name, "_writeCapacity"):
		buckets, unit = raftRateBuckets, " Its samples are log entries a second."
	}
	return prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: o.Namespace, Subsystem: o.Subsystem, Name: o.Name, Help: o.Help + unit,
		ConstLabels: o.ConstLabels, Buckets: buckets,
	})
}

// Describe describes nothing: the sink's metrics appear as raft measures
// them, so the registry checks them as it collects (an unchecked
// collector).
func (s *raftSink) Describe(chan<- *prometheus.Desc) {}

// Collect sends every metric raft has measured so far. It sends them
// after letting the sink's lock go: a new key waiting for the lock would
// otherwise hold up every sample, raft's hot paths included, until the
// scrape had read them all.
func (s *raftSink) Collect(ch chan<- prometheus.Metric) {
	s.mu.RLock()
	metrics := make([]prometheus.Collector, 0, len(s.metrics))
	for _, m := range s.metrics {
		metrics = append(metrics, m)
	}
	s.mu.RUnlock()
	for _, m := range metrics {
		m.Collect(ch)
	}
}

package server

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	gometrics "github.com/hashicorp/go-metrics/compat"
	gmprometheus "github.com/hashicorp/go-metrics/compat/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

// Each kind of go-metrics call becomes its Prometheus metric, named as
// go-metrics' own sink named it, labels included; a key used as a second
// kind keeps its first.
func TestRaftSinkKeepsEachMeasurement(t *testing.T) {
	s := newRaftSink()
	s.AddSample([]string{"fence", "raft", "commitTime"}, 0.4)
	s.AddSample([]string{"fence", "raft", "commitTime"}, 3)
	s.AddSampleWithLabels([]string{"fence", "raft", "replication", "appendEntries", "rpc"}, 0.2, []gometrics.Label{{Name: "peer-id", Value: "n2"}})
	s.AddSampleWithLabels([]string{"fence", "raft", "replication", "appendEntries", "rpc"}, 0.3, []gometrics.Label{{Name: "peer-id", Value: "n3"}})
	s.IncrCounter([]string{"fence", "raft", "apply"}, 2)
	s.IncrCounter([]string{"fence", "raft", "apply"}, 1)
	s.SetGauge([]string{"fence", "raft", "leader.oldestLogAge"}, 7)
	s.SetGauge([]string{"fence", "raft", "apply"}, 99) // a counter already: dropped
	s.EmitKey([]string{"fence", "raft", "something"}, 1)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				values[f.GetName()+" counter"] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				values[f.GetName()+" gauge"] = m.GetGauge().GetValue()
			}
		}
	}
	if want := map[string]float64{"fence_raft_apply counter": 3, "fence_raft_leader_oldestLogAge gauge": 7}; !maps.Equal(values, want) {
		t.Errorf("counters and gauges: %v, want %v", values, want)
	}
	type histogram struct {
		sum   float64
		count uint64
	}
	got := map[string]histogram{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			if h := m.GetHistogram(); h != nil {
				labels := ""
				for _, l := range m.GetLabel() {
					labels += l.GetName() + "=" + l.GetValue()
				}
				got[f.GetName()+"{"+labels+"}"] = histogram{h.GetSampleSum(), h.GetSampleCount()}
			}
		}
	}
	for name, want := range map[string]histogram{
		"fence_raft_commitTime{}":                              {3.4, 2},
		"fence_raft_replication_appendEntries_rpc{peer_id=n2}": {0.2, 1},
		"fence_raft_replication_appendEntries_rpc{peer_id=n3}": {0.3, 1},
	} {
		h, ok := got[name]
		if !ok || h.count != want.count || math.Abs(h.sum-want.sum) > 1e-6 {
			t.Errorf("%s: %+v (found %v), want a histogram of %+v (all: %v)", name, h, ok, want, got)
		}
	}
	if len(got) != 3 {
		t.Errorf("%d histograms, want 3: %v", len(got), got)
	}
}

// Keys that differ only in characters a Prometheus name may not hold
// (raft's per-peer keys for node ids "n-1" and "n.1") are one metric: two
// of one name would fail every scrape of /metrics. (Found in review.)
func TestRaftSinkKeysAreTheirPrometheusNames(t *testing.T) {
	s := newRaftSink()
	s.SetGauge([]string{"fence", "raft", "replication", "heartbeat", "node-1"}, 1)
	s.SetGauge([]string{"fence", "raft", "replication", "heartbeat", "node.1"}, 2)
	s.AddSampleWithLabels([]string{"fence", "raft", "x"}, 1, []gometrics.Label{{Name: "peer-id", Value: "n1"}})
	s.AddSampleWithLabels([]string{"fence", "raft", "x"}, 1, []gometrics.Label{{Name: "peer_id", Value: "n1"}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gathering: %v", err)
	}
	for _, f := range families {
		if n := len(f.GetMetric()); n != 1 {
			t.Errorf("%s: %d metrics, want 1", f.GetName(), n)
		}
		if f.GetName() == "fence_raft_replication_heartbeat_node_1" && f.GetMetric()[0].GetGauge().GetValue() != 2 {
			t.Errorf("%s = %v, want the last value set, 2", f.GetName(), f.GetMetric()[0].GetGauge().GetValue())
		}
	}
	if len(families) != 2 {
		t.Errorf("%d families, want 2", len(families))
	}
}

// A sample of a metric seen before allocates nothing: raft measures
// several per operation on every node.
func TestRaftSinkSampleAllocatesNothing(t *testing.T) {
	s := newRaftSink()
	key := []string{"fence", "raft", "rpc", "appendEntries", "storeLogs"}
	labels := []gometrics.Label{{Name: "peer_id", Value: "n2"}}
	s.AddSampleWithLabels(key, 1, labels)
	if allocs := testing.AllocsPerRun(1000, func() { s.AddSampleWithLabels(key, 0.3, labels) }); allocs != 0 {
		t.Errorf("%v allocations a sample, want 0", allocs)
	}
}

// BenchmarkRaftSinkSample is one timer sample through fence's sink and
// through go-metrics' own Prometheus sink, which it replaces.
func BenchmarkRaftSinkSample(b *testing.B) {
	key := []string{"fence", "raft", "rpc", "appendEntries", "storeLogs"}
	b.Run("fence", func(b *testing.B) {
		s := newRaftSink()
		b.ReportAllocs()
		for b.Loop() {
			s.AddSample(key, 0.3)
		}
	})
	b.Run("go-metrics-prometheus", func(b *testing.B) {
		s, err := gmprometheus.NewPrometheusSinkFrom(gmprometheus.PrometheusOpts{Registerer: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			s.AddSample(key, 0.3)
		}
	})
}

// raft's samples that are not timers get buckets of their own: a
// goroutine's saturation is a share from 0 to 1, and an FSM batch a count
// of entries; neither is said to be milliseconds.
func TestRaftSinkBucketsFitWhatIsSampled(t *testing.T) {
	s := newRaftSink()
	s.AddSample([]string{"fence", "raft", "thread", "main", "saturation"}, 0.42)
	s.AddSample([]string{"fence", "raft", "fsm", "applyBatchNum"}, 17)
	s.AddSample([]string{"fence", "raft", "commitTime"}, 0.4)
	s.AddSample([]string{"fence", "raft", "boltdb", "logBatchSize"}, 3000)
	s.AddSample([]string{"fence", "raft", "boltdb", "writeCapacity"}, 5000)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(s)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		name       string
		top        float64 // the last finite bucket's bound
		ms         bool    // whether the help says milliseconds
		below, lte float64 // a bucket bound just below the sample, and the first at or above it
	}{
		{"fence_raft_thread_main_saturation", 1, false, 0.4, 0.5},
		{"fence_raft_fsm_applyBatchNum", 1024, false, 16, 32},
		{"fence_raft_commitTime", 10000, true, 0.3, 0.5},
		{"fence_raft_boltdb_logBatchSize", 64 << 18, false, 1024, 4096},
		{"fence_raft_boltdb_writeCapacity", 10 << 18, false, 2560, 10240},
	} {
		var found bool
		for _, f := range families {
			if f.GetName() != want.name {
				continue
			}
			found = true
			h := f.GetMetric()[0].GetHistogram()
			bounds := []float64{}
			for _, b := range h.GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
			if top := bounds[len(bounds)-1]; top != want.top {
				t.Errorf("%s: buckets %v, want the last at %v", want.name, bounds, want.top)
			}
			if !slices.Contains(bounds, want.below) || !slices.Contains(bounds, want.lte) {
				t.Errorf("%s: buckets %v, want bounds %v and %v about its sample", want.name, bounds, want.below, want.lte)
			}
			if ms := strings.Contains(f.GetHelp(), "milliseconds"); ms != want.ms {
				t.Errorf("%s: help %q, want it to say milliseconds: %v", want.name, f.GetHelp(), want.ms)
			}
		}
		if !found {
			t.Errorf("no metric %s", want.name)
		}
	}
}

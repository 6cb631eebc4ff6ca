package server

import (
	"bufio"
	"context"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// scrape returns the samples of a node's /metrics, by name with labels
// as written ("fence_lock_waiters_bucket{le=\"1\"}").
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	samples := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		samples[line[:i]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return samples
}

// The operator's metrics show what the node did: a lock with one holder
// and two waiters, a KV key, a watch, proposals, log appends, a
// snapshot, the leader, and the build.
func TestOperatorMetrics(t *testing.T) {
	s, a := startWithAPI(t, func(c *Config) { c.Version = "v1.2.3-test" })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	holder := a.session(10 * time.Second)
	a.mustAcquire(holder, "queue")
	for range 2 {
		a.acquireAsync(ctx, &fencev1.AcquireRequest{SessionId: a.session(10 * time.Second), Lock: "queue"})
	}
	waitFor(t, "two waiters", func() bool { return len(a.lock("queue").GetWaiters()) == 2 })
	a.mustAcquire(holder, "idle")

	kv := fencev1connect.NewKVServiceClient(http.DefaultClient, "http://"+s.Addr())
	if _, err := kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "config", Value: []byte("12345")})); err != nil {
		t.Fatal(err)
	}
	watch, err := kv.Watch(ctx, connect.NewRequest(&fencev1.WatchRequest{Prefix: "config"}))
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	waitFor(t, "the watch to open", func() bool { return s.watches.count() == 1 })
	if err := s.node.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}

	m := scrape(t, "http://"+s.Addr()+"/metrics")
	exact := map[string]float64{
		"fence_has_leader":                     1,
		"fence_kv_keys":                        1,
		"fence_kv_bytes":                       float64(len("config") + len("12345")),
		"fence_watchers":                       1,
		"fence_waiters":                        2,
		"fence_lock_waiters_count":             2, // "queue" and "idle"
		`fence_lock_waiters_bucket{le="0"}`:    1,
		`fence_lock_waiters_bucket{le="1"}`:    1,
		`fence_lock_waiters_bucket{le="2"}`:    2,
		`fence_lock_waiters_bucket{le="+Inf"}`: 2,
		`fence_build_info{goversion="` + goVersion() + `",revision="",version="v1.2.3-test"}`: 1,
	}
	for name, want := range exact {
		if got, ok := m[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
	atLeast := map[string]float64{
		"fence_leader_changes_seen_total":     1,
		"fence_raft_term":                     1,
		"fence_raft_commit_index":             5,
		"fence_raft_applied_index":            5,
		"fence_proposal_seconds_count":        5,
		"fence_disk_log_append_seconds_count": 5,
		"fence_sessions":                      3,
	}
	for name, min := range atLeast {
		if got, ok := m[name]; !ok || got < min {
			t.Errorf("%s = %v (present %v), want at least %v", name, got, ok, min)
		}
	}
	if _, ok := m["fence_proposals_failed_total"]; !ok {
		t.Error("fence_proposals_failed_total is missing")
	}
	// raft's own measurements, through go-metrics.
	for _, name := range []string{"fence_raft_commitTime_count", "fence_raft_snapshot_persist_count", "fence_raft_fsm_applyBatch_count"} {
		if m[name] < 1 {
			t.Errorf("raft's %s = %v, want at least 1", name, m[name])
		}
	}
}

func goVersion() string { return runtime.Version() }

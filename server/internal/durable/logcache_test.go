package durable

import (
	"runtime"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// The log cache keeps copies of the entries it is handed, not the
// structures they were handed in: raft hands a leader's entries as
// pointers into its futures, which hold the FSM's results.
func TestLogCacheKeepsNoFuture(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(raft.LogStore, *raft.Log) error
	}{
		{"StoreLogs", func(s raft.LogStore, l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }},
		{"StoreLog", func(s raft.LogStore, l *raft.Log) error { return s.StoreLog(l) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache, err := raft.NewLogCache(16, raft.NewInmemStore())
			if err != nil {
				t.Fatal(err)
			}
			logs := DetachedLogs{LogCache: cache}
			type future struct {
				log      raft.Log
				response [4096]byte
			}
			f := &future{log: raft.Log{Index: 1, Term: 1, Type: raft.LogCommand, Data: []byte("cmd")}}
			freed := make(chan struct{})
			runtime.SetFinalizer(f, func(*future) { close(freed) })
			if err := tc.store(logs, &f.log); err != nil {
				t.Fatal(err)
			}
			f = nil
			deadline := time.Now().Add(5 * time.Second)
		wait:
			for {
				runtime.GC()
				select {
				case <-freed:
					break wait
				case <-time.After(10 * time.Millisecond):
				}
				if time.Now().After(deadline) {
					t.Fatal("the cache keeps the structure its entry was handed in")
				}
			}
			var got raft.Log
			if err := logs.GetLog(1, &got); err != nil || string(got.Data) != "cmd" {
				t.Fatalf("GetLog(1) = %v %q, %v", got.Index, got.Data, err)
			}
			if logs.IsMonotonic() != cache.IsMonotonic() {
				t.Fatal("IsMonotonic is not the cache's")
			}
		})
	}
}

package durable

import "github.com/hashicorp/raft"

// DetachedLogs hands the log cache below it copies of the entries raft
// stores. A leader's raft passes pointers into its in-flight futures, so a
// cache that kept them would keep each future alive as long as its entry:
// with it the FSM's result, and for a batch every command's result. After
// a storm of session creations that was 150 bytes a session, held for as
// long as the cache's 1,024 entries.
type DetachedLogs struct{ *raft.LogCache }

// StoreLog stores a copy of l.
func (d DetachedLogs) StoreLog(l *raft.Log) error {
	c := *l
	return d.LogCache.StoreLog(&c)
}

// StoreLogs stores copies of logs.
func (d DetachedLogs) StoreLogs(logs []*raft.Log) error {
	copies := make([]raft.Log, len(logs))
	ptrs := make([]*raft.Log, len(logs))
	for i, l := range logs {
		copies[i] = *l
		ptrs[i] = &copies[i]
	}
	return d.LogCache.StoreLogs(ptrs)
}

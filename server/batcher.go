package server

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/fencelock/fence/internal/fsm"
)

// Bounds of one raft entry made of queued proposals. A proposal larger
// than maxBatchBytes on its own still goes, alone.
const (
	maxBatchCommands = 256
	maxBatchBytes    = 256 << 10
)

// maxInFlight is how many entries the batcher has raft commit at once.
// With one, everything proposed while an entry is being committed gathers
// into the next: measured on two cores (fence bench, 16 clients on their
// own locks), that is 20-30% more cycles a second than with two in
// flight, on one node and on three, where with two every other entry went
// almost alone. A hot lock's chain of hand-offs, which waits on each
// commit in turn, loses about 8% on three nodes (the entry in flight
// delays the next release), and nothing on one. Letting only a release
// that hands a lock to a waiter go at once, beside the entry in flight,
// measured no better either (2026-12-05, peerbench, 16 clients on one hot
// lock: +4%, -16%, +10% in three rounds; on their own locks, whose
// releases hand nothing over, -7% to -19% from the state read it takes):
// with the two cores saturated by the bench, an extra entry's fsyncs and
// messages cost what its early commit saves.
const maxInFlight = 1

// batcher commits proposals with group commit: a proposal that finds
// fewer than maxInFlight entries being committed is proposed at once, by
// its caller, alone; those that arrive while maxInFlight are being
// committed queue, and go
// together as one Batch entry as soon as one of those is committed (up to
// maxBatchCommands and maxBatchBytes; the rest wait for the next). raft's
// cost per entry (its log write and CRC, the apply and its future) is so
// paid once per batch, and nobody waits on an idle node.
type batcher struct {
	n *node

	mu       sync.Mutex
	queue    []*proposal // not empty only while inFlight == maxInFlight
	inFlight int
}

type proposal struct {
	data  []byte
	start time.Time
	done  chan proposalResult // capacity 1: the committer never blocks
}

type proposalResult struct {
	res fsm.Result
	seq fsm.Seq
	err error
}

func newBatcher(n *node) *batcher { return &batcher{n: n} }

// propose commits an encoded command and returns its result, or an error
// once the node closes.
func (b *batcher) propose(data []byte) (fsm.Result, fsm.Seq, error) {
	p := &proposal{data: data, start: time.Now(), done: make(chan proposalResult, 1)}
	b.mu.Lock()
	if b.inFlight < maxInFlight && len(b.queue) == 0 {
		b.inFlight++
		b.mu.Unlock()
		b.commit([]*proposal{p})
		b.finished()
	} else {
		b.queue = append(b.queue, p)
		b.mu.Unlock()
	}
	select {
	case r := <-p.done:
		return r.res, r.seq, r.err
	case <-b.n.closed:
		return fsm.Result{}, 0, raft.ErrRaftShutdown
	}
}

// finished frees the slot of an entry committed, and proposes what queued
// meanwhile.
func (b *batcher) finished() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inFlight--
	for b.inFlight < maxInFlight && len(b.queue) > 0 {
		batch := b.takeLocked()
		b.inFlight++
		go func() {
			b.commit(batch)
			b.finished()
		}()
	}
}

// takeLocked removes the next batch from the queue, within the bounds.
func (b *batcher) takeLocked() []*proposal {
	limit := maxBatchCommands
	if b.n.fsm.Protocol() < fsm.Protocol2 {
		limit = 1 // a member may not know Batch entries
	}
	n, size := 0, 0
	for n < len(b.queue) && n < limit {
		size += len(b.queue[n].data)
		if n > 0 && size > maxBatchBytes {
			break
		}
		n++
	}
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil // let the backing array go
	}
	return batch
}

// commit proposes batch as one entry and hands each proposal its own
// result: a lone command goes as itself, several as a Batch.
func (b *batcher) commit(batch []*proposal) {
	data := batch[0].data
	if len(batch) > 1 {
		data = encodeBatch(batch)
	}
	f := b.n.raft.Apply(data, b.n.timeout)
	err := b.n.await(f)
	var res fsm.Result
	if err == nil {
		var ok bool
		if res, ok = f.Response().(fsm.Result); !ok {
			err = fmt.Errorf("raft returned %T, not a result", f.Response())
		}
	}
	results := res.Batch()
	if err == nil && len(batch) > 1 {
		switch {
		case res.Err != nil:
			err = fmt.Errorf("batch of %d commands refused: %w", len(batch), res.Err)
		case len(results) != len(batch):
			err = fmt.Errorf("batch of %d commands answered %d results", len(batch), len(results))
		}
	}
	for i, p := range batch {
		b.n.metrics.proposed(p.start, err)
		r := proposalResult{err: err}
		if err == nil {
			r.seq = fsm.SeqOf(f.Index(), i)
			r.res = res
			if len(batch) > 1 {
				r.res = results[i]
			}
		}
		p.done <- r
	}
}

// Field numbers of fsmpb.Command.batch and fsmpb.Batch.commands.
const (
	commandBatchField  = 30
	batchCommandsField = 1
)

// encodeBatch encodes a Batch command of the proposals' commands, which
// are already encoded, without decoding them again.
func encodeBatch(batch []*proposal) []byte {
	body := 0
	for _, p := range batch {
		body += protowire.SizeTag(batchCommandsField) + protowire.SizeBytes(len(p.data))
	}
	out := make([]byte, 0, protowire.SizeTag(commandBatchField)+protowire.SizeBytes(body))
	out = protowire.AppendTag(out, commandBatchField, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(body))
	for _, p := range batch {
		out = protowire.AppendTag(out, batchCommandsField, protowire.BytesType)
		out = protowire.AppendBytes(out, p.data)
	}
	return out
}

package durable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus"
)

// Neither raft log store checks what it reads back: raft-boltdb's pages
// carry no checksum, and raft-wal checks only the last batch it wrote, when
// it reopens a segment. A flipped bit in an entry would be applied as data,
// and a flipped frame header in the middle of raft-wal's open segment makes
// it drop every entry after it, acknowledged ones included. CheckedLog closes
// the first hole: every entry it stores carries a CRC-32C of its index, term,
// type, extensions and data, checked on every read. CheckWALTail closes the
// second (walcheck.go).

// entryMagic starts the data of every entry CheckedLog stores, followed by
// the checksum (little endian) and the entry's own data.
var entryMagic = [4]byte{0xfe, 'f', 'c', 1}

const entryHeaderLen = len(entryMagic) + 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CheckedFromKey names the stable-store value that holds the first index
// stored with a checksum. A data dir written before checksums existed has
// entries below it without one; they are read as they are.
var CheckedFromKey = []byte("fence-log-checksums-from")

// errLogCorrupt marks an entry whose checksum does not match.
var errLogCorrupt = errors.New("raft log entry is corrupt")

// CheckedLog stores raft log entries with a checksum and verifies it on
// every read. It never changes the entries raft hands it: it stores copies.
type CheckedLog struct {
	raft.LogStore
	// from is the first index that must carry a checksum.
	from uint64
	// full is set while the last write failed for want of space, and
	// failing while it failed at all.
	full, failing atomic.Bool
	// AppendSeconds, when set, observes how long each append took, its
	// fsync included.
	AppendSeconds prometheus.Observer
	// writeFailed, when set, is called with the error of each append that
	// failed (OnWriteFailed).
	writeFailed atomic.Pointer[func(error)]
}

// OnWriteFailed has f called with the error of every append that fails,
// on the goroutine that appended (raft's), before the error is returned:
// f must not block.
func (c *CheckedLog) OnWriteFailed(f func(error)) { c.writeFailed.Store(&f) }

// Full reports whether the last write failed for want of space.
func (c *CheckedLog) Full() bool { return c.full.Load() }

// Failing reports whether the last write failed, for whatever reason
// (raft-wal reports a segment it could not make as "segment is sealed").
func (c *CheckedLog) Failing() bool { return c.failing.Load() }

// NewCheckedLog wraps store. For a data dir whose log predates checksums,
// the first index stored from now on is recorded in stable, so that later
// reads know which entries must carry one.
func NewCheckedLog(store raft.LogStore, stable raft.StableStore) (*CheckedLog, error) {
	from, err := stable.GetUint64(CheckedFromKey)
	if err != nil || from == 0 {
		last, err := store.LastIndex()
		if err != nil {
			return nil, err
		}
		from = last + 1
		if err := stable.SetUint64(CheckedFromKey, from); err != nil {
			return nil, fmt.Errorf("recording where log checksums begin: %w", err)
		}
	}
	return &CheckedLog{LogStore: store, from: from}, nil
}

// GetLog reads the entry at index and verifies its checksum.
func (c *CheckedLog) GetLog(index uint64, log *raft.Log) error {
	if err := c.LogStore.GetLog(index, log); err != nil {
		return err
	}
	if log.Index != index {
		return fmt.Errorf("%w: asked for index %d, the store returned index %d", errLogCorrupt, index, log.Index)
	}
	data, sealed, ok := UnwrapEntry(log)
	switch {
	case ok:
		log.Data = data
		return nil
	case sealed:
		return fmt.Errorf("%w: the checksum of index %d (term %d) does not match its contents", errLogCorrupt, index, log.Term)
	case index >= c.from:
		return fmt.Errorf("%w: index %d (term %d) has no checksum, and every entry from index %d has one", errLogCorrupt, index, log.Term, c.from)
	}
	return nil // stored before checksums existed
}

// StoreLog stores one entry with its checksum.
func (c *CheckedLog) StoreLog(log *raft.Log) error {
	return c.StoreLogs([]*raft.Log{log})
}

// StoreLogs stores entries with their checksums.
func (c *CheckedLog) StoreLogs(logs []*raft.Log) error {
	wrapped := make([]*raft.Log, len(logs))
	copies := make([]raft.Log, len(logs))
	for i, l := range logs {
		copies[i] = *l
		copies[i].Data = wrapEntry(l)
		wrapped[i] = &copies[i]
	}
	start := time.Now()
	err := c.LogStore.StoreLogs(wrapped)
	if c.AppendSeconds != nil {
		c.AppendSeconds.Observe(time.Since(start).Seconds())
	}
	c.full.Store(errors.Is(err, syscall.ENOSPC))
	c.failing.Store(err != nil)
	if f := c.writeFailed.Load(); err != nil && f != nil {
		(*f)(err)
	}
	return err
}

// IsMonotonic passes on raft-wal's answer: it cannot store a log with gaps.
func (c *CheckedLog) IsMonotonic() bool {
	m, ok := c.LogStore.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

// verify reads every entry in the log, so that a node finds corruption when
// it starts rather than when it applies or replicates the entry.
func (c *CheckedLog) Verify() error {
	first, last, err := logBounds(c)
	if err != nil {
		return err
	}
	if last == 0 {
		return nil
	}
	var l raft.Log
	for i := first; i <= last; i++ {
		if err := c.GetLog(i, &l); err != nil {
			return &CorruptLogError{index: i, err: err}
		}
	}
	return nil
}

// CorruptLogError is a log entry that could not be read back intact.
type CorruptLogError struct {
	index uint64
	err   error
}

func (e *CorruptLogError) Error() string {
	return fmt.Sprintf("log index %d: %v", e.index, e.err)
}

func (e *CorruptLogError) Unwrap() error { return e.err }

func wrapEntry(l *raft.Log) []byte {
	out := make([]byte, entryHeaderLen+len(l.Data))
	copy(out, entryMagic[:])
	binary.LittleEndian.PutUint32(out[len(entryMagic):], entrySum(l, l.Data))
	copy(out[entryHeaderLen:], l.Data)
	return out
}

// UnwrapEntry returns the entry's own data and whether it was stored with
// a checksum (sealed) that matches (ok). No command, configuration or empty
// entry raft or fence writes begins with entryMagic's first byte, so data
// stored before checksums existed is never taken for sealed.
func UnwrapEntry(l *raft.Log) (data []byte, sealed, ok bool) {
	if len(l.Data) < entryHeaderLen || !bytes.Equal(l.Data[:len(entryMagic)], entryMagic[:]) {
		return nil, false, false
	}
	data = l.Data[entryHeaderLen:]
	want := binary.LittleEndian.Uint32(l.Data[len(entryMagic):])
	return data, true, entrySum(l, data) == want
}

// entrySum is the CRC-32C of everything raft reads from an entry but the
// time it was appended.
func entrySum(l *raft.Log, data []byte) uint32 {
	var head [8 + 8 + 1 + 8]byte
	binary.LittleEndian.PutUint64(head[0:], l.Index)
	binary.LittleEndian.PutUint64(head[8:], l.Term)
	head[16] = byte(l.Type)
	binary.LittleEndian.PutUint64(head[17:], uint64(len(l.Extensions)))
	sum := crc32.Update(0, castagnoli, head[:])
	sum = crc32.Update(sum, castagnoli, l.Extensions)
	return crc32.Update(sum, castagnoli, data)
}

// logBounds returns the first and last index of a log, 0 and 0 if empty.
func logBounds(logs raft.LogStore) (first, last uint64, err error) {
	if first, err = logs.FirstIndex(); err == nil {
		last, err = logs.LastIndex()
	}
	return first, last, err
}

package durable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"sort"

	"github.com/hashicorp/raft"
	wal "github.com/hashicorp/raft-wal"

	"github.com/fencelock/fence/internal/walfmt"
)

// When raft-wal reopens its open (tail) segment it reads frames until the
// first header that is not one, and takes that for the torn end of a write
// that never completed. A header damaged in the middle of the segment looks
// the same, and everything after it, batches that were fsynced and
// acknowledged, is silently dropped: the node comes back at an older index
// and would hand out tokens it has handed out before. CheckWALTail tells the
// two apart. A torn write can only damage the last batch, so a complete batch
// (its frames intact and its commit checksum matching) after the point where
// the reading stopped proves the damage is not a torn write. The format is
// described in internal/walfmt.

// committedBatch reports whether a complete batch begins at start: frames
// that end in a commit frame whose checksum covers them, with at least one
// entry. It returns the batch's first index.
func committedBatch(data []byte, start int) (first uint64, ok bool) {
	off := start
	for {
		f, valid := walfmt.ReadFrame(data, off)
		if !valid {
			return 0, false
		}
		switch f.Type {
		case walfmt.FrameCommit:
			return first, first != 0 && crc32.Checksum(data[start:off], castagnoli) == f.Sum
		case walfmt.FrameEntry:
			if first == 0 {
				index, n := binary.Uvarint(data[off+walfmt.FrameHeaderLen : off+walfmt.FrameHeaderLen+f.Size])
				if n <= 0 || index == 0 {
					return 0, false
				}
				first = index
			}
		}
		off = f.Next(off)
	}
}

// CheckWALTail returns an error if the tail segment in dir holds a complete
// batch after the point where raft-wal stops reading it: entries that were
// acknowledged and that raft-wal would drop without a word.
func CheckWALTail(dir string) error {
	segs, err := walfmt.Segments(dir)
	if err != nil || len(segs) == 0 {
		return err
	}
	tail := segs[len(segs)-1]
	data, err := walfmt.ReadWritten(tail.Path)
	if err != nil {
		return err
	}
	stop := walfmt.Walk(data, func(int, walfmt.Frame) {})
	for off := stop + walfmt.FrameHeaderLen; off+walfmt.FrameHeaderLen <= len(data); off += walfmt.FrameHeaderLen {
		// Jump to the next commit frame header.
		i := bytes.Index(data[off:], commitHeader[:])
		if i < 0 {
			break
		}
		if off += i; off%walfmt.FrameHeaderLen != 0 {
			off -= off % walfmt.FrameHeaderLen
			continue
		}
		if first, ok := committedBatch(data, off+walfmt.FrameHeaderLen); ok {
			return &WALDamage{path: tail.Path, offset: stop, what: fmt.Sprintf(
				"the frames break off here, yet a complete batch from log index %d follows at offset %d: entries that were written and acknowledged would be lost",
				first, off+walfmt.FrameHeaderLen)}
		}
	}
	return nil
}

// commitHeader is how a commit frame's header begins.
var commitHeader = [4]byte{walfmt.FrameCommit, 0, 0, 0}

// walEntryOffset returns where the frame of index begins in the segment
// that holds it, for messages about a damaged entry.
func walEntryOffset(dir string, index uint64) (path string, off int, ok bool) {
	segs, err := walfmt.Segments(dir)
	if err != nil {
		return "", 0, false
	}
	i := sort.Search(len(segs), func(i int) bool { return segs[i].Base > index }) - 1
	if i < 0 {
		return "", 0, false
	}
	data, err := walfmt.ReadWritten(segs[i].Path)
	if err != nil {
		return "", 0, false
	}
	entries := walfmt.EntryOffsets(data)
	if want := index - segs[i].Base; want < uint64(len(entries)) {
		return segs[i].Path, entries[want], true
	}
	return segs[i].Path, walfmt.Walk(data, func(int, walfmt.Frame) {}), true // the frames break off before it
}

// WALDamage is damage found in a segment file.
type WALDamage struct {
	path   string
	offset int
	what   string
}

func (e *WALDamage) Error() string {
	return fmt.Sprintf("%s, offset %d: %s", e.path, e.offset, e.what)
}

// recoveryAdvice is what an operator can do about a data dir whose state
// cannot be trusted or rebuilt.
const recoveryAdvice = "To recover: in a group whose other members are healthy, remove this member (fence members remove ID), " +
	"move the data dir aside and start the node again with an empty data dir and --join: it copies the group's state. " +
	"A single node: restore the data dir from a backup. Keep the damaged data dir for diagnosis."

// CorruptLogMessage is what a node that finds its log damaged says: where,
// and what an operator can do about it.
func CorruptLogMessage(dataDir string, detail error) error {
	return fmt.Errorf("the raft log in %s is damaged and this node will not start: %w.\n"+
		"Starting on it could undo acknowledged writes and hand out a fencing token twice; do not delete the damaged file and start again.\n%s",
		dataDir, detail, recoveryAdvice)
}

// TruncatedWAL hides entries that raft-wal (v0.4.0 to v0.4.2) still returns after a
// head truncation: its GetLog reads the tail segment before checking the
// first index, so after compaction a leader was handed entries it had
// deleted and replicated from a log with holes instead of sending its
// snapshot. A node that came back after compaction never caught up.
type TruncatedWAL struct{ *wal.WAL }

// GetLog reads the entry at index, or raft.ErrLogNotFound below the
// WAL's first index.
func (w TruncatedWAL) GetLog(index uint64, log *raft.Log) error {
	first, err := w.WAL.FirstIndex()
	if err != nil {
		return err
	}
	if index < first {
		return raft.ErrLogNotFound
	}
	return w.WAL.GetLog(index, log)
}

// LocateDamage names the file, and for raft-wal the offset, that holds a
// log entry that did not read back intact.
func LocateDamage(dataDir string, isWAL bool, err error) error {
	var bad *CorruptLogError
	if !errors.As(err, &bad) {
		return err
	}
	file := filepath.Join(dataDir, "raft.db")
	if isWAL {
		file = filepath.Join(dataDir, "wal")
		if path, off, ok := walEntryOffset(file, bad.index); ok {
			return &WALDamage{path: path, offset: off, what: bad.Error()}
		}
	}
	return fmt.Errorf("%s: %w", file, bad)
}

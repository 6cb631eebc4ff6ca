package server

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// raft-wal's segment format (github.com/hashicorp/raft-wal, segment/format.go,
// v0.4.2): a 32-byte file header, then 8-byte-aligned frames. A frame header
// is a type byte, three zero bytes and a little-endian uint32 that is the
// payload's length, or for a commit frame the CRC-32C of everything written
// since the previous commit frame. Each batch of entries ends in a commit
// frame, written and fsynced with its entries.
//
// When raft-wal reopens its open (tail) segment it reads frames until the
// first header that is not one, and takes that for the torn end of a write
// that never completed. A header damaged in the middle of the segment looks
// the same, and everything after it, batches that were fsynced and
// acknowledged, is silently dropped: the node comes back at an older index
// and would hand out tokens it has handed out before. checkWALTail tells the
// two apart. A torn write can only damage the last batch, so a complete batch
// (its frames intact and its commit checksum matching) after the point where
// the reading stopped proves the damage is not a torn write.
const (
	walFileHeaderLen  = 32
	walFrameHeaderLen = 8
	walFrameEntry     = 1
	walFrameIndex     = 2
	walFrameCommit    = 3
)

// walFrame is one frame header read from a segment.
type walFrame struct {
	typ  byte
	size int    // payload bytes, without padding
	sum  uint32 // a commit frame's checksum
}

// next is the offset of the frame after this one, which begins at off.
func (f walFrame) next(off int) int {
	pad := (walFrameHeaderLen - f.size%walFrameHeaderLen) % walFrameHeaderLen
	return off + walFrameHeaderLen + f.size + pad
}

// readWALFrame reads the frame header at off; ok is false where there is
// none (zeros, the end of the file, or damage).
func readWALFrame(data []byte, off int) (f walFrame, ok bool) {
	if off+walFrameHeaderLen > len(data) || data[off+1] != 0 || data[off+2] != 0 || data[off+3] != 0 {
		return f, false
	}
	word := binary.LittleEndian.Uint32(data[off+4:])
	switch f.typ = data[off]; f.typ {
	case walFrameCommit:
		f.sum = word
		return f, true
	case walFrameEntry, walFrameIndex:
		f.size = int(word)
		return f, f.next(off) <= len(data)
	}
	return f, false
}

// walSegment is one segment file and the first index it holds.
type walSegment struct {
	path string
	base uint64
}

// walSegments lists a raft-wal directory's segment files in index order.
func walSegments(dir string) ([]walSegment, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil {
		return nil, err
	}
	var segs []walSegment
	for _, name := range names {
		var base, id uint64
		if _, err := fmt.Sscanf(filepath.Base(name), "%020d-%016x.wal", &base, &id); err != nil {
			continue
		}
		segs = append(segs, walSegment{path: name, base: base})
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].base < segs[j].base })
	return segs, nil
}

// walStop is where reading a segment's frames from the start stops: the
// offset of the first header that is not one, or the end of the data.
// entries counts the entry frames before it.
func walStop(data []byte) (off, entries int) {
	off = walFileHeaderLen
	for {
		f, ok := readWALFrame(data, off)
		if !ok {
			return off, entries
		}
		if f.typ == walFrameEntry {
			entries++
		}
		off = f.next(off)
	}
}

// committedBatch reports whether a complete batch begins at start: frames
// that end in a commit frame whose checksum covers them, with at least one
// entry. It returns the batch's first index.
func committedBatch(data []byte, start int) (first uint64, ok bool) {
	off := start
	for {
		f, valid := readWALFrame(data, off)
		if !valid {
			return 0, false
		}
		switch f.typ {
		case walFrameCommit:
			return first, first != 0 && crc32.Checksum(data[start:off], castagnoli) == f.sum
		case walFrameEntry:
			if first == 0 {
				index, n := binary.Uvarint(data[off+walFrameHeaderLen : off+walFrameHeaderLen+f.size])
				if n <= 0 || index == 0 {
					return 0, false
				}
				first = index
			}
		}
		off = f.next(off)
	}
}

// checkWALTail returns an error if the tail segment in dir holds a complete
// batch after the point where raft-wal stops reading it: entries that were
// acknowledged and that raft-wal would drop without a word.
func checkWALTail(dir string) error {
	segs, err := walSegments(dir)
	if err != nil || len(segs) == 0 {
		return err
	}
	tail := segs[len(segs)-1]
	data, err := readWritten(tail.path)
	if err != nil {
		return err
	}
	stop, _ := walStop(data)
	for off := stop + walFrameHeaderLen; off+walFrameHeaderLen <= len(data); off += walFrameHeaderLen {
		// Jump to the next commit frame header.
		i := bytes.Index(data[off:], commitHeader[:])
		if i < 0 {
			break
		}
		if off += i; off%walFrameHeaderLen != 0 {
			off -= off % walFrameHeaderLen
			continue
		}
		if first, ok := committedBatch(data, off+walFrameHeaderLen); ok {
			return &walDamage{path: tail.path, offset: stop, what: fmt.Sprintf(
				"the frames break off here, yet a complete batch from log index %d follows at offset %d: entries that were written and acknowledged would be lost",
				first, off+walFrameHeaderLen)}
		}
	}
	return nil
}

// commitHeader is how a commit frame's header begins.
var commitHeader = [4]byte{walFrameCommit, 0, 0, 0}

// zeroRun is how many zero bytes in a row end what readWritten reads.
const zeroRun = 1 << 20

// readWritten reads a segment file up to the end of what was written to
// it: raft-wal preallocates segments with zeros, and those need not be read.
// It stops at the first zeroRun-aligned run of zeroRun zero bytes, so a
// stretch of the written part longer than that turned to zeros hides what
// comes after it.
func readWritten(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var data []byte
	chunk := make([]byte, zeroRun)
	for {
		n, err := io.ReadFull(f, chunk)
		if n > 0 && bytes.Count(chunk[:n], []byte{0}) == n {
			return trimZeros(data), nil
		}
		data = append(data, chunk[:n]...)
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return trimZeros(data), nil
		case err != nil:
			return nil, err
		}
	}
}

// trimZeros drops the zero bytes at the end of b, but for those that
// complete the last 8-byte-aligned frame slot (a commit frame's checksum may
// end in zeros).
func trimZeros(b []byte) []byte {
	end := len(bytes.TrimRight(b, "\x00"))
	end = min(len(b), (end+walFrameHeaderLen-1)/walFrameHeaderLen*walFrameHeaderLen)
	return b[:end]
}

// walEntryOffset returns where the frame of index begins in the segment
// that holds it, for messages about a damaged entry.
func walEntryOffset(dir string, index uint64) (path string, off int, ok bool) {
	segs, err := walSegments(dir)
	if err != nil {
		return "", 0, false
	}
	i := sort.Search(len(segs), func(i int) bool { return segs[i].base > index }) - 1
	if i < 0 {
		return "", 0, false
	}
	data, err := readWritten(segs[i].path)
	if err != nil {
		return "", 0, false
	}
	want := index - segs[i].base
	off = walFileHeaderLen
	for n := uint64(0); ; {
		f, valid := readWALFrame(data, off)
		if !valid {
			return segs[i].path, off, true // the frames break off before it
		}
		if f.typ == walFrameEntry {
			if n == want {
				return segs[i].path, off, true
			}
			n++
		}
		off = f.next(off)
	}
}

// walDamage is damage found in a segment file.
type walDamage struct {
	path   string
	offset int
	what   string
}

func (e *walDamage) Error() string {
	return fmt.Sprintf("%s, offset %d: %s", e.path, e.offset, e.what)
}

// recoveryAdvice is what an operator can do about a data dir whose state
// cannot be trusted or rebuilt.
const recoveryAdvice = "To recover: in a group whose other members are healthy, remove this member (fence members remove ID), " +
	"move the data dir aside and start the node again with an empty data dir and --join: it copies the group's state. " +
	"A single node: restore the data dir from a backup. Keep the damaged data dir for diagnosis."

// corruptLogMessage is what a node that finds its log damaged says: where,
// and what an operator can do about it.
func corruptLogMessage(dataDir string, detail error) error {
	return fmt.Errorf("the raft log in %s is damaged and this node will not start: %w.\n"+
		"Starting on it could undo acknowledged writes and hand out a fencing token twice; do not delete the damaged file and start again.\n%s",
		dataDir, detail, recoveryAdvice)
}

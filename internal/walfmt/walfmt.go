// Package walfmt reads the on-disk format of hashicorp/raft-wal's segment
// files (segment/format.go, v0.4.2), for the checks raft-wal does not make:
// a 32-byte file header, then 8-byte-aligned frames. A frame header is a
// type byte, three zero bytes and a little-endian uint32 that is the
// payload's length, or for a commit frame the CRC-32C of everything written
// since the previous commit frame. Each batch of entries ends in a commit
// frame, written and fsynced with its entries.
//
// It stands on the ground floor: the server checks its log's tail with it,
// and the fence command's checker corrupts segment files with it.
package walfmt

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
)

// Sizes and frame types of the format.
const (
	FileHeaderLen  = 32
	FrameHeaderLen = 8
	FrameEntry     = 1
	FrameIndex     = 2
	FrameCommit    = 3
)

// Frame is one frame header read from a segment.
type Frame struct {
	Type byte
	Size int    // payload bytes, without padding
	Sum  uint32 // a commit frame's checksum
}

// Next is the offset of the frame after this one, which begins at off.
func (f Frame) Next(off int) int {
	pad := (FrameHeaderLen - f.Size%FrameHeaderLen) % FrameHeaderLen
	return off + FrameHeaderLen + f.Size + pad
}

// ReadFrame reads the frame header at off; ok is false where there is none
// (zeros, the end of the data, or damage).
func ReadFrame(data []byte, off int) (f Frame, ok bool) {
	if off+FrameHeaderLen > len(data) || data[off+1] != 0 || data[off+2] != 0 || data[off+3] != 0 {
		return f, false
	}
	word := binary.LittleEndian.Uint32(data[off+4:])
	switch f.Type = data[off]; f.Type {
	case FrameCommit:
		f.Sum = word
		return f, true
	case FrameEntry, FrameIndex:
		f.Size = int(word)
		return f, f.Next(off) <= len(data)
	}
	return f, false
}

// Walk calls fn for each frame from the start of a segment's data until
// the frames break off, and returns where they did.
func Walk(data []byte, fn func(off int, f Frame)) (stop int) {
	off := FileHeaderLen
	for {
		f, ok := ReadFrame(data, off)
		if !ok {
			return off
		}
		fn(off, f)
		off = f.Next(off)
	}
}

// EntryOffsets returns where each entry frame of a segment's data begins,
// up to where the frames break off.
func EntryOffsets(data []byte) []int {
	var offs []int
	Walk(data, func(off int, f Frame) {
		if f.Type == FrameEntry {
			offs = append(offs, off)
		}
	})
	return offs
}

// Segment is one segment file and the first index it holds.
type Segment struct {
	Path string
	Base uint64
}

// Segments lists a raft-wal directory's segment files in index order.
func Segments(dir string) ([]Segment, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.wal"))
	if err != nil {
		return nil, err
	}
	var segs []Segment
	for _, name := range names {
		var base, id uint64
		if _, err := fmt.Sscanf(filepath.Base(name), "%020d-%016x.wal", &base, &id); err != nil {
			continue
		}
		segs = append(segs, Segment{Path: name, Base: base})
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].Base < segs[j].Base })
	return segs, nil
}

// zeroRun is how many zero bytes in a row end what ReadWritten reads.
const zeroRun = 1 << 20

// ReadWritten reads a segment file up to the end of what was written to
// it: raft-wal preallocates segments with zeros, and those need not be read.
// It stops at the first zeroRun-aligned run of zeroRun zero bytes, so a
// stretch of the written part longer than that turned to zeros hides what
// comes after it. The result ends on a frame boundary.
func ReadWritten(path string) ([]byte, error) {
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
	end = min(len(b), (end+FrameHeaderLen-1)/FrameHeaderLen*FrameHeaderLen)
	return b[:end]
}

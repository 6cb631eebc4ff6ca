package server

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

// castagnoli is the CRC-32C table of a snapshot file's header.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A snapshot file (fence snapshot save) is three text lines and a body:
//
//	FENCE-SNAPSHOT 1                    the format and its version
//	{"format":1,"index":...}            the header, one line of JSON
//	crc32c 1a2b3c4d                     CRC-32C of the header line, without its newline
//	<body>                              the state machine's snapshot, header.size bytes
//
// The body is exactly what raft snapshots hold (fsmpb.Snapshot, encoded
// deterministically), and its SHA-256 is in the header. Nothing follows it.
const (
	snapshotMagic = "FENCE-SNAPSHOT"
	// SnapshotFormat is the version of the snapshot file format this fence
	// writes and reads.
	SnapshotFormat = 1
	// maxSnapshotHeader bounds the header line a reader accepts.
	maxSnapshotHeader = 64 << 10
)

// SnapshotHeader describes a snapshot file's body.
type SnapshotHeader struct {
	// Format is the file format's version (SnapshotFormat).
	Format int `json:"format"`
	// Created is when the file was written.
	Created time.Time `json:"created"`
	// NodeID and Version name the leader that took the snapshot and its
	// fence version.
	NodeID  string `json:"node_id"`
	Version string `json:"fence_version"`
	// Index and Term are the raft log position of the last entry the state
	// includes.
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
	// LastToken is the last fencing token issued in the state.
	LastToken uint64 `json:"last_token"`
	// Size and SHA256 (hex) are the body's length and checksum.
	Size   uint64 `json:"body_bytes"`
	SHA256 string `json:"body_sha256"`
}

// SnapshotFile is a snapshot file read back and verified: its header and
// its body, whose checksum matched and whose state is consistent.
type SnapshotFile struct {
	Header SnapshotHeader
	// Body is the state machine's snapshot.
	Body  []byte
	state *fsmpb.Snapshot
}

// SnapshotCounts is what a snapshot's state holds.
type SnapshotCounts struct {
	Sessions int `json:"sessions"`
	// Locks are the locks held, waited for or delayed; Holders and Waiters
	// are counted over all of them.
	Locks   int `json:"locks"`
	Holders int `json:"holders"`
	Waiters int `json:"waiters"`
	// Keys are the live KV keys; Tombstones the deleted fenced keys kept.
	Keys       int    `json:"kv_keys"`
	Tombstones int    `json:"kv_tombstones"`
	KVRevision uint64 `json:"kv_revision"`
	LastToken  uint64 `json:"last_token"`
	// LastSessionID is the highest session id handed out.
	LastSessionID uint64 `json:"last_session_id"`
}

// Counts counts what the snapshot's state holds.
func (f *SnapshotFile) Counts() SnapshotCounts {
	st := f.state
	c := SnapshotCounts{Sessions: len(st.GetSessions()), Locks: len(st.GetLocks()), KVRevision: st.GetKvRevision(),
		LastToken: st.GetLastToken(), LastSessionID: st.GetLastSessionId()}
	for _, l := range st.GetLocks() {
		c.Holders += len(l.GetHolders())
		c.Waiters += len(l.GetWaiters())
	}
	for _, kv := range st.GetKvs() {
		if kv.GetDeleted() {
			c.Tombstones++
		} else {
			c.Keys++
		}
	}
	return c
}

// WriteSnapshotFile writes a snapshot file at path, atomically: to a
// temporary file in the same directory, fsynced, then renamed over path,
// and the directory fsynced. h must carry the body's Size and SHA256;
// body is read to its end and must match them, or nothing is left at path.
func WriteSnapshotFile(path string, h SnapshotHeader, body io.Reader) (err error) {
	h.Format = SnapshotFormat
	line, err := json.Marshal(h)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("writing snapshot %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	w := bufio.NewWriter(tmp)
	fmt.Fprintf(w, "%s %d\n%s\ncrc32c %08x\n", snapshotMagic, SnapshotFormat, line, crc32.Checksum(line, castagnoli))
	sum := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, sum), body)
	if err != nil {
		return fmt.Errorf("writing snapshot %s: %w", path, err)
	}
	if got := hex.EncodeToString(sum.Sum(nil)); uint64(n) != h.Size || got != h.SHA256 {
		return fmt.Errorf("writing snapshot %s: the body is %d bytes with SHA-256 %s, but its header says %d bytes with %s; nothing was written",
			path, n, got, h.Size, h.SHA256)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("writing snapshot %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("writing snapshot %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing snapshot %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("writing snapshot %s: %w", path, err)
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadSnapshotFile reads the snapshot file at path and verifies it: the
// format, the header's checksum, the body's length and SHA-256, and that
// the body decodes to a consistent state whose last token is the header's.
// Its errors name the file and say what is wrong with it.
func ReadSnapshotFile(path string) (*SnapshotFile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading snapshot: %w", err)
	}
	defer f.Close()
	return decodeSnapshotFile(path, f)
}

// maxSnapshotBody bounds the body a snapshot file may have.
const maxSnapshotBody = 1 << 34

// decodeSnapshotFile reads and verifies a snapshot file from r; name is
// what errors call it.
func decodeSnapshotFile(name string, rd io.Reader) (*SnapshotFile, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("snapshot %s is not usable: %s", name, fmt.Sprintf(format, args...))
	}
	r := bufio.NewReader(rd)
	magic, err := readLine(r, 64)
	if err != nil {
		return nil, bad("it does not start with a fence snapshot header (%v)", err)
	}
	kind, ver, _ := strings.Cut(magic, " ")
	if kind != snapshotMagic {
		return nil, bad("it is not a fence snapshot file (it starts with %q, not %q)", clip(magic), snapshotMagic)
	}
	if v, err := strconv.Atoi(ver); err != nil || v != SnapshotFormat {
		return nil, bad("it is in snapshot format %q; this fence reads format %d (a newer fence may read it)", clip(ver), SnapshotFormat)
	}
	line, err := readLine(r, maxSnapshotHeader)
	if err != nil {
		return nil, bad("its header is cut off (%v)", err)
	}
	crcLine, err := readLine(r, 64)
	if err != nil {
		return nil, bad("its header checksum is cut off (%v)", err)
	}
	var want uint32
	if _, err := fmt.Sscanf(crcLine, "crc32c %x", &want); err != nil {
		return nil, bad("its header checksum line %q does not read", clip(crcLine))
	}
	if got := crc32.Checksum([]byte(line), castagnoli); got != want {
		return nil, bad("its header is damaged (CRC-32C %08x, the file says %08x)", got, want)
	}
	var h SnapshotHeader
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return nil, bad("its header does not decode: %v", err)
	}
	if h.Format != SnapshotFormat {
		return nil, bad("its header says format %d; this fence reads format %d", h.Format, SnapshotFormat)
	}
	if h.Size > maxSnapshotBody {
		return nil, bad("its header says the body is %d bytes, more than the %d a snapshot may have", h.Size, uint64(maxSnapshotBody))
	}
	// Read what is there rather than allocate what the header claims.
	body, err := io.ReadAll(io.LimitReader(r, int64(h.Size)))
	if err != nil {
		return nil, bad("reading its body: %v", err)
	}
	if uint64(len(body)) < h.Size {
		return nil, bad("it is truncated: the header promises %d bytes of body, the file holds %d", h.Size, len(body))
	}
	if extra, _ := io.Copy(io.Discard, r); extra > 0 {
		return nil, bad("%d bytes follow the end of the body (%d bytes, as the header says)", extra, h.Size)
	}
	sum := sha256.Sum256(body)
	if got := hex.EncodeToString(sum[:]); got != h.SHA256 {
		return nil, bad("its body is damaged: SHA-256 %s, the header says %s", got, clip(h.SHA256))
	}
	var snap fsmpb.Snapshot
	if err := proto.Unmarshal(body, &snap); err != nil {
		return nil, bad("its body does not decode: %v", err)
	}
	if _, err := fsm.Restore(&snap); err != nil {
		return nil, bad("its state is inconsistent: %v", err)
	}
	if snap.GetLastToken() != h.LastToken {
		return nil, bad("its header says the last token is %d, the state says %d", h.LastToken, snap.GetLastToken())
	}
	return &SnapshotFile{Header: h, Body: body, state: &snap}, nil
}

// readLine reads one line of at most limit bytes, without its newline.
func readLine(r *bufio.Reader, limit int) (string, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > limit+1 {
			return "", fmt.Errorf("a line longer than %d bytes", limit)
		}
		switch {
		case err == nil:
			return string(bytes.TrimSuffix(line, []byte("\n"))), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return "", fmt.Errorf("the file ends after %d bytes of the line", len(line))
		default:
			return "", err
		}
	}
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

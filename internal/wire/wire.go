// Package wire carries the session stream's messages directly on a
// connection, as length-prefixed frames, after an HTTP/1.1 upgrade
// (docs/design.md, The session stream, Framed on the connection).
//
// HTTP/2 hands each message between several goroutines on each side (the
// connection's reader, its serving loop, a writer per flush, a pipe to the
// handler), and on a small machine each hand-off is a thread woken on
// another core. A Conn is read by one goroutine at a time (which may hand
// the reading on to another between frames) and written by whichever
// goroutine has a message: the first writer writes what the others queue
// meanwhile, in one system call, so that no goroutine exists only to
// write and a busy stream writes many messages per call.
//
// A frame is a type byte, the payload's length as an unsigned varint, and
// the payload: a protobuf message (the stream's own StreamRequest or
// StreamResponse), or a ping or its pong (eight opaque bytes echoed), by
// which a side finds a far end that went silent while the stream idles.
package wire

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"
)

// Protocol is the token of the HTTP/1.1 Upgrade that starts a framed
// session stream: the request carries "Connection: Upgrade" and
// "Upgrade: fence-stream/1", and the node answers "101 Switching
// Protocols" with the same Upgrade, then frames.
const Protocol = "fence-stream/1"

// Frame types.
const (
	frameMessage byte = 0
	framePing    byte = 1
	framePong    byte = 2
)

// pingBytes is the size of a ping's payload.
const pingBytes = 8

// ErrFrameTooLarge is the error of a frame over the reader's bound.
var ErrFrameTooLarge = errors.New("wire: frame over the size limit")

// maxQueued bounds the bytes queued behind a write in progress: a far end
// that reads so much slower than it asks (or pings without reading the
// pongs) breaks the stream rather than hold the memory. One frame larger
// than that may still be queued alone.
const maxQueued = 16 << 20

// Conn is one framed stream. Read is called by one goroutine at a time;
// Write by any number at once.
type Conn struct {
	conn         net.Conn
	r            *bufio.Reader
	maxRead      int
	writeTimeout time.Duration

	mu      sync.Mutex
	pending []byte // frames queued for the writer
	spare   []byte // the buffer last written, reused for the next queue
	writing bool   // a goroutine is writing pending
	ponging bool   // a pong is in pending
	err     error  // the first write error: the stream is broken

	lastRead  atomic.Int64 // unix nanoseconds of the last frame read
	lastWrite atomic.Int64 // unix nanoseconds of the last write that ended
	rbuf      []byte       // a frame larger than r's buffer
	peeked    int          // bytes of r's buffer the payload being read holds
}

// NewConn frames conn. r reads conn (it may hold bytes already read from
// it); frames over maxRead bytes fail the read. Each write of the
// connection gives up after writeTimeout (0: never): a far end that does
// not read for that long is gone or stuck.
func NewConn(conn net.Conn, r *bufio.Reader, maxRead int, writeTimeout time.Duration) *Conn {
	if r == nil {
		r = bufio.NewReader(conn)
	}
	c := &Conn{conn: conn, r: r, maxRead: maxRead, writeTimeout: writeTimeout}
	now := time.Now().UnixNano()
	c.lastRead.Store(now)
	c.lastWrite.Store(now)
	return c
}

// encodePool holds buffers for frames being encoded.
var encodePool = sync.Pool{New: func() any { return new([]byte) }}

// Write sends m. It returns once m is written, or queued behind the write
// of another goroutine, which then writes it. It fails when the stream
// broke before m was written: a write failed, or timed out (the far end
// stopped reading and the socket's buffer is full), and then the
// connection is closed, so that the reader and every other writer learn
// it at once. No caller gives up on a write of its own accord: the bytes
// of others' frames may be in the same write, and a frame cut short
// would break the stream for all of them.
func (c *Conn) Write(m proto.Message) error {
	bp := encodePool.Get().(*[]byte)
	defer encodePool.Put(bp)
	b, err := appendMessage((*bp)[:0], m)
	*bp = b[:0]
	if err != nil {
		return err
	}
	return c.queue(b, false)
}

// appendMessage appends m's frame to b.
func appendMessage(b []byte, m proto.Message) ([]byte, error) {
	size := proto.Size(m) // sizes every part once, for MarshalAppend to reuse
	b = append(b, frameMessage)
	b = binary.AppendUvarint(b, uint64(size))
	return proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
}

// Ping sends a ping; the far end answers it with a pong, which counts as
// a frame read (ReadIdle).
func (c *Conn) Ping() error {
	frame := []byte{framePing, pingBytes, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint64(frame[2:], uint64(time.Now().UnixNano()))
	return c.queue(frame, false)
}

// queue adds frame to what is to be written and, unless another goroutine
// is writing, writes until nothing is left. A pong is not queued while
// another waits to be written: a far end that pings faster than it reads
// gets one. It returns an error when the stream broke before frame was
// written; a write of later frames that fails does not fail the caller
// whose frame went before (closing the connection tells everyone).
func (c *Conn) queue(frame []byte, pong bool) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	switch {
	case pong && c.ponging:
		c.mu.Unlock()
		return nil
	case len(c.pending) > 0 && len(c.pending)+len(frame) > maxQueued:
		c.err = fmt.Errorf("writing the stream: over %d bytes wait to be written: the far end reads too slowly", maxQueued)
		err := c.err
		c.mu.Unlock()
		_ = c.conn.Close()
		return err
	}
	c.pending = append(c.pending, frame...)
	c.ponging = c.ponging || pong
	if c.writing {
		c.mu.Unlock()
		return nil
	}
	c.writing = true
	var own error // the error of the write that held frame
	for first := true; len(c.pending) > 0 && c.err == nil; first = false {
		out := c.pending
		c.pending = c.spare[:0]
		c.ponging = false
		c.mu.Unlock()
		err := c.write(out)
		c.mu.Lock()
		if cap(out) <= 64<<10 {
			c.spare = out // a big burst's buffer is not kept
		} else {
			c.spare = nil
		}
		if err != nil {
			c.err = fmt.Errorf("writing the stream: %w", err)
			if first {
				own = c.err
			}
		}
	}
	c.writing = false
	broken := c.err != nil
	if broken {
		c.pending, c.spare = nil, nil
	}
	c.mu.Unlock()
	if broken {
		_ = c.conn.Close()
	}
	return own
}

// write writes b to the connection, within the write timeout.
func (c *Conn) write(b []byte) error {
	if c.writeTimeout > 0 {
		_ = c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	_, err := c.conn.Write(b)
	c.lastWrite.Store(time.Now().UnixNano())
	return err
}

// Read reads the next message into m, answering pings on the way.
func (c *Conn) Read(m proto.Message) error {
	for {
		typ, payload, err := c.next()
		if err != nil {
			return err
		}
		switch typ {
		case frameMessage:
			err := proto.Unmarshal(payload, m)
			c.done()
			return err
		case framePing:
			pong := append([]byte{framePong, pingBytes}, payload...)
			c.done()
			if err := c.queue(pong, true); err != nil {
				return err
			}
		default:
			c.done()
		}
	}
}

// next reads one frame: its type and payload. The payload is valid until
// done is called.
func (c *Conn) next() (byte, []byte, error) {
	typ, err := c.r.ReadByte()
	if err != nil {
		return 0, nil, err
	}
	n, err := binary.ReadUvarint(c.r)
	if err != nil {
		return 0, nil, unexpected(err)
	}
	switch {
	case typ > framePong:
		return 0, nil, fmt.Errorf("wire: unknown frame type %d", typ)
	case typ != frameMessage && n != pingBytes:
		return 0, nil, fmt.Errorf("wire: a ping or pong of %d bytes, want %d", n, pingBytes)
	case n > uint64(c.maxRead):
		return 0, nil, fmt.Errorf("%w: a frame of %d bytes, over the limit of %d", ErrFrameTooLarge, n, c.maxRead)
	}
	c.lastRead.Store(time.Now().UnixNano())
	if int(n) <= c.r.Size() {
		// Most frames: read in place from the reader's buffer.
		b, err := c.r.Peek(int(n))
		if err != nil {
			return 0, nil, unexpected(err)
		}
		c.peeked = int(n)
		return typ, b, nil
	}
	// A big frame: its buffer grows as its bytes arrive, so that a far end
	// that declares a big frame and sends little of it costs little.
	c.rbuf = c.rbuf[:0]
	for len(c.rbuf) < int(n) {
		chunk := min(int(n)-len(c.rbuf), max(len(c.rbuf), 64<<10))
		c.rbuf = slices.Grow(c.rbuf, chunk)
		if _, err := io.ReadFull(c.r, c.rbuf[len(c.rbuf):len(c.rbuf)+chunk]); err != nil {
			return 0, nil, unexpected(err)
		}
		c.rbuf = c.rbuf[:len(c.rbuf)+chunk]
	}
	return typ, c.rbuf, nil
}

// done releases the payload next returned.
func (c *Conn) done() {
	if c.peeked > 0 {
		_, _ = c.r.Discard(c.peeked)
		c.peeked = 0
	}
	if cap(c.rbuf) > 1<<20 {
		c.rbuf = nil // a rare big frame's buffer is not kept
	}
}

// unexpected makes an end of the connection inside a frame an error of
// its own: only an end between frames is io.EOF.
func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ReadIdle returns how long ago the last frame was read.
func (c *Conn) ReadIdle() time.Duration {
	return time.Since(time.Unix(0, c.lastRead.Load()))
}

// WriteIdle returns how long ago the last write ended (or the Conn was
// made, before any).
func (c *Conn) WriteIdle() time.Duration {
	return time.Since(time.Unix(0, c.lastWrite.Load()))
}

// InterruptRead ends a Read blocked on the connection, and every Read
// after it, with an error: the reader's side of the stream is over.
func (c *Conn) InterruptRead() { _ = c.conn.SetReadDeadline(time.Unix(1, 0)) }

// Close closes the connection; a Read or Write blocked on it returns.
func (c *Conn) Close() error { return c.conn.Close() }

// Asked reports whether request headers h ask to switch the connection to
// Protocol.
func Asked(h http.Header) bool {
	return hasToken(h, "Connection", "upgrade") && hasToken(h, "Upgrade", Protocol)
}

// Switched reports whether response headers h switch the connection to
// Protocol.
func Switched(h http.Header) bool { return hasToken(h, "Upgrade", Protocol) }

// hasToken reports whether the comma-separated values of header name
// include token, in any case.
func hasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for part := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), token) {
				return true
			}
		}
	}
	return false
}

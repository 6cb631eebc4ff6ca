// Package wire carries the session stream's messages directly on a
// connection, as length-prefixed frames, after an HTTP/1.1 upgrade
// (docs/design.md, The session stream, Framed on the connection).
//
// HTTP/2 hands each message between several goroutines on each side (the
// connection's reader, its serving loop, a writer per flush, a pipe to the
// handler), and on a small machine each hand-off is a thread woken on
// another core. A Conn is read by one goroutine and written by whichever
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
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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

// Conn is one framed stream. Read is called from one goroutine; Write
// from any number.
type Conn struct {
	conn         net.Conn
	r            *bufio.Reader
	maxRead      int
	writeTimeout time.Duration

	mu      sync.Mutex
	pending []byte // frames queued for the writer
	spare   []byte // the buffer last written, reused for the next queue
	writing bool   // a goroutine is writing pending
	err     error  // the first write error: the stream is broken

	lastRead atomic.Int64 // unix nanoseconds of the last frame read
	rbuf     []byte       // a frame larger than r's buffer
	peeked   int          // bytes of r's buffer the payload being read holds
}

// NewConn frames conn. r reads conn (it may hold bytes already read from
// it); frames over maxRead bytes fail the read. Each write of the
// connection gives up after writeTimeout (0: never), failing the stream: a
// far end that does not read for that long is gone or stuck.
func NewConn(conn net.Conn, r *bufio.Reader, maxRead int, writeTimeout time.Duration) *Conn {
	if r == nil {
		r = bufio.NewReader(conn)
	}
	c := &Conn{conn: conn, r: r, maxRead: maxRead, writeTimeout: writeTimeout}
	c.lastRead.Store(time.Now().UnixNano())
	return c
}

// encodePool holds buffers for frames being encoded.
var encodePool = sync.Pool{New: func() any { return new([]byte) }}

// Write sends m. It returns once m is written, or queued behind the write
// of another goroutine, which then writes it; the error is the stream's
// when it broke. A write blocked longer than ctx lasts (the far end
// stopped reading and the socket's buffer is full) breaks the stream, as
// a stream whose peer does not read is of no more use.
func (c *Conn) Write(ctx context.Context, m proto.Message) error {
	bp := encodePool.Get().(*[]byte)
	defer encodePool.Put(bp)
	b, err := appendMessage((*bp)[:0], m)
	*bp = b[:0]
	if err != nil {
		return err
	}
	return c.queue(ctx, b)
}

// appendMessage appends m's frame to b.
func appendMessage(b []byte, m proto.Message) ([]byte, error) {
	size := proto.Size(m) // sizes every part once, for MarshalAppend to reuse
	b = append(b, frameMessage)
	b = binary.AppendUvarint(b, uint64(size))
	return proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, m)
}

// Ping sends a ping; the far end answers it with a pong, which counts as
// a frame read (Idle).
func (c *Conn) Ping() error {
	frame := []byte{framePing, pingBytes, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.BigEndian.PutUint64(frame[2:], uint64(time.Now().UnixNano()))
	return c.queue(context.Background(), frame)
}

// queue adds frame to what is to be written and, unless another goroutine
// is writing, writes until nothing is left.
func (c *Conn) queue(ctx context.Context, frame []byte) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.pending = append(c.pending, frame...)
	if c.writing {
		c.mu.Unlock()
		return nil
	}
	c.writing = true
	for len(c.pending) > 0 && c.err == nil {
		out := c.pending
		c.pending = c.spare[:0]
		c.mu.Unlock()
		err := c.write(ctx, out)
		c.mu.Lock()
		if cap(out) <= 64<<10 {
			c.spare = out // a big burst's buffer is not kept
		} else {
			c.spare = nil
		}
		if err != nil && c.err == nil {
			c.err = fmt.Errorf("writing the stream: %w", err)
		}
	}
	c.writing = false
	err := c.err
	c.mu.Unlock()
	return err
}

// write writes b to the connection, within the write timeout and ctx.
func (c *Conn) write(ctx context.Context, b []byte) error {
	if c.writeTimeout > 0 {
		_ = c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() { _ = c.conn.SetWriteDeadline(time.Unix(1, 0)) })
		defer stop()
	}
	_, err := c.conn.Write(b)
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
			if err := c.queue(context.Background(), pong); err != nil {
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
	if cap(c.rbuf) < int(n) {
		c.rbuf = make([]byte, n)
	}
	c.rbuf = c.rbuf[:n]
	if _, err := io.ReadFull(c.r, c.rbuf); err != nil {
		return 0, nil, unexpected(err)
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

// Idle returns how long ago the last frame was read.
func (c *Conn) Idle() time.Duration {
	return time.Since(time.Unix(0, c.lastRead.Load()))
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

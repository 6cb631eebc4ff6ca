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
// meanwhile, in one system call, while they wait for it, so that no
// goroutine exists only to write and a busy stream writes many messages
// per call.
//
// A frame is a type byte, the payload's length as an unsigned varint, and
// the payload: a protobuf message (the stream's own StreamRequest or
// StreamResponse), or a ping or its pong (eight opaque bytes echoed), by
// which a side finds a far end that went silent while the stream idles.
//
// It stands on the ground floor, shared by the client and the server.
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

// ErrLeftQueued is in the error of a WriteContext whose context ended
// after its frame was queued: the frame goes out all the same.
var ErrLeftQueued = errors.New("wire: the caller left; its frame stays queued")

// maxQueued bounds the bytes queued behind a write in progress: past it,
// writers wait for room. One frame larger than that may still be queued
// alone.
const maxQueued = 16 << 20

// Conn is one framed stream. Read is called by one goroutine at a time;
// Write by any number at once.
type Conn struct {
	conn    net.Conn
	raw     net.Conn // conn without TLS: closed at once when the stream breaks
	r       *bufio.Reader
	maxRead int

	mu           sync.Mutex
	changed      sync.Cond     // broadcast when a write ends
	room         sync.Cond     // broadcast when pending is taken, to those waiting for room
	roomWaiters  int           // callers waiting on room
	writeTimeout time.Duration // bounds each writeChunk's progress
	pending      []byte        // frames queued for the next write
	spare        []byte        // the buffer last written, reused for the next queue
	taken        uint64        // writes begun: pending goes in write number taken
	written      uint64        // writes that ended well
	waiters      int           // callers waiting for pending to be written
	writing      bool          // a goroutine is writing
	ponging      bool          // a pong is in pending
	err          error         // the first write error: the stream is broken
	broken       atomic.Bool   // err is set

	lastRead  atomic.Int64 // unix nanoseconds of the last frame read
	lastWrite atomic.Int64 // unix nanoseconds of the last write that ended
	rbuf      []byte       // a frame larger than r's buffer
	peeked    int          // bytes of r's buffer the payload being read holds
}

// NewConn frames conn. r reads conn (it may hold bytes already read from
// it); frames over maxRead bytes fail the read. A write that makes no
// progress for writeTimeout (0: no bound) breaks the stream: a far end
// that does not read for that long is gone or stuck.
func NewConn(conn net.Conn, r *bufio.Reader, maxRead int, writeTimeout time.Duration) *Conn {
	if r == nil {
		r = bufio.NewReader(conn)
	}
	c := &Conn{conn: conn, raw: Bare(conn), r: r, maxRead: maxRead, writeTimeout: writeTimeout}
	c.changed.L = &c.mu
	c.room.L = &c.mu
	now := time.Now().UnixNano()
	c.lastRead.Store(now)
	c.lastWrite.Store(now)
	return c
}

// encodePool holds buffers for frames being encoded.
var encodePool = sync.Pool{New: func() any { return new([]byte) }}

// Write sends m, and returns once m is written (perhaps by another
// goroutine, in one write with other frames), or the stream broke first:
// a write failed, or made no progress for the write timeout (the far end
// stopped reading and the sockets' buffers are full). A broken stream's
// connection is closed at once, so that its reader and every writer learn
// it. No caller gives up on a write of its own accord: others' frames may
// share it, and a frame cut short would break the stream for all of
// them. A caller waits for the write before its own and its own (and,
// rarely, a pong written after it); one that finds maxQueued bytes
// already waiting waits for room first. An error means m's fate is
// unknown: the part of a write before its failure may have arrived.
func (c *Conn) Write(m proto.Message) error { return c.WriteContext(context.Background(), m) }

// WriteContext is Write, except that a caller waiting for another's write
// stops waiting when ctx ends, and returns ctx's error: its frame, if
// queued, still goes out with the next write (so the far end may act on
// it; the error is then also ErrLeftQueued), and the stream is not
// broken. A caller that is itself writing waits for its write, which the
// write timeout bounds: no write is cut short. So when the far end stops
// reading, only the caller whose write filled the socket waits for the
// write timeout; those queued behind it keep to their own deadlines.
func (c *Conn) WriteContext(ctx context.Context, m proto.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.broken.Load() {
		return c.queue(ctx, nil, false) // the stream's error, without marshalling m
	}
	bp := encodePool.Get().(*[]byte)
	defer encodePool.Put(bp)
	b, err := appendMessage((*bp)[:0], m)
	*bp = b[:0]
	if err != nil {
		return err
	}
	return c.queue(ctx, b, false)
}

// Finish writes m, the last frame of the stream, giving up after within
// without progress (or the write timeout, if shorter).
func (c *Conn) Finish(m proto.Message, within time.Duration) error {
	c.mu.Lock()
	if within > 0 && (c.writeTimeout == 0 || within < c.writeTimeout) {
		c.writeTimeout = within
	}
	c.mu.Unlock()
	return c.Write(m)
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
	return c.queue(context.Background(), frame, false)
}

// queue adds frame to what is to be written, and waits until it is
// written: by this goroutine when no other is writing (with whatever
// others queued meanwhile), else by the writer, or by one of the callers
// queued with it. A pong is not waited for (the reader that queues it
// goes on reading; the writer writes it), and is not queued while another
// waits to be written: a far end that pings faster than it reads gets
// one. A nil frame only returns the stream's error. A caller waiting on
// another goroutine gives up when ctx ends (WriteContext).
func (c *Conn) queue(ctx context.Context, frame []byte, pong bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var stop func() bool // wakes this caller's waits when ctx ends, once set
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	wait := func(cond *sync.Cond) {
		if stop == nil && ctx.Done() != nil {
			stop = context.AfterFunc(ctx, func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				c.changed.Broadcast()
				c.room.Broadcast()
			})
		}
		cond.Wait()
	}
	if pong {
		switch {
		case c.err != nil:
			return c.err
		case c.ponging:
			return nil
		}
		c.pending = append(c.pending, frame...)
		c.ponging = true
		if !c.writing && c.waiters == 0 {
			// Else the callers waiting for pending write it: the reader
			// writes no one else's frames, so that it goes on reading.
			c.writeLocked(false)
		}
		return nil
	}
	for c.err == nil && ctx.Err() == nil && len(c.pending) > 0 && len(c.pending)+len(frame) > maxQueued {
		c.roomWaiters++
		wait(&c.room)
		c.roomWaiters--
	}
	if c.err != nil || frame == nil {
		return c.err
	}
	if err := ctx.Err(); err != nil {
		return err // before there was room, or as it was made: not queued
	}
	c.pending = append(c.pending, frame...)
	c.waiters++
	batch := c.taken // the number the write of pending will have
	for c.written <= batch && c.err == nil {
		switch {
		case ctx.Err() != nil:
			c.leaveLocked(batch)
			return fmt.Errorf("%w: %w", ErrLeftQueued, ctx.Err())
		case c.writing:
			wait(&c.changed)
		default:
			c.writeLocked(false)
		}
	}
	if c.written > batch {
		return nil
	}
	return c.err
}

// leaveLocked is the part of a caller that stops waiting for write number
// batch: if its frame is still queued it no longer waits for it, and
// when no one else does and no write is under way, the Conn's own
// goroutine writes it (flush).
func (c *Conn) leaveLocked(batch uint64) {
	if c.taken != batch {
		return // taken by a write, which counts no waiters
	}
	c.waiters--
	if c.waiters == 0 && !c.writing && len(c.pending) > 0 {
		c.flushLocked()
	}
}

// flushLocked has a goroutine of the Conn's own write pending, which no
// caller waits for.
func (c *Conn) flushLocked() {
	c.writing = true // no caller takes the writing meanwhile
	go func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.writeLocked(true)
	}()
}

// writeLocked writes pending. A caller's write (flush false) stops once
// what is left has callers waiting for it, who write it; what no caller
// waits for (a pong, the frames of callers that left) it leaves to flush,
// so that no caller waits on others' frames. It is called with mu held,
// which it releases while writing.
func (c *Conn) writeLocked(flush bool) {
	c.writing = true
	for len(c.pending) > 0 && c.err == nil {
		out, timeout := c.pending, c.writeTimeout
		c.pending, c.spare = c.spare[:0], nil
		c.ponging = false
		c.waiters = 0
		c.taken++
		if c.roomWaiters > 0 {
			c.room.Broadcast()
		}
		c.mu.Unlock()
		err := c.write(out, timeout)
		c.mu.Lock()
		if cap(out) <= 64<<10 {
			c.spare = out // a big burst's buffer is not kept
		} else {
			c.spare = nil
		}
		if err == nil {
			c.written++
		} else if c.err == nil {
			c.err = fmt.Errorf("writing the stream: %w", err)
			c.broken.Store(true)
			c.pending, c.spare = nil, nil
			_ = c.raw.Close()
			c.room.Broadcast()
		}
		c.changed.Broadcast()
		if c.waiters > 0 {
			break // one of them writes the rest
		}
		if !flush && len(c.pending) > 0 && c.err == nil {
			c.flushLocked()
			return
		}
	}
	c.writing = false
}

// writeChunk is how much of a write must go out within the write timeout:
// a far end that reads, however slowly, keeps the stream.
const writeChunk = 256 << 10

// write writes b to the connection, each writeChunk of it within timeout
// (0: no bound).
func (c *Conn) write(b []byte, timeout time.Duration) error {
	for len(b) > 0 {
		n := min(len(b), writeChunk)
		if timeout > 0 {
			_ = c.conn.SetWriteDeadline(time.Now().Add(timeout))
		}
		_, err := c.conn.Write(b[:n])
		c.lastWrite.Store(time.Now().UnixNano())
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
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
			if err := c.queue(context.Background(), pong, true); err != nil {
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

// Bare returns conn without its TLS layer (tls.Conn's), or conn itself:
// closing it ends the connection at once, where a TLS close writes its
// close_notify first, which waits on a far end that stopped reading.
func Bare(conn net.Conn) net.Conn {
	if tc, ok := conn.(interface{ NetConn() net.Conn }); ok {
		return tc.NetConn()
	}
	return conn
}

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

package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	a, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b := <-accepted
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func checkOp(name string) *fencev1.StreamRequest {
	return &fencev1.StreamRequest{Id: 1, Op: &fencev1.StreamRequest_Check{Check: &fencev1.CheckRequest{Lock: name}}}
}

// Messages written from many goroutines at once all arrive whole, in
// fewer writes of the connection than messages (a writer writes what the
// others queued meanwhile), and a message larger than the reader's buffer
// arrives too.
func TestConcurrentWritesArriveWhole(t *testing.T) {
	a, b := pair(t)
	counted := &countingConn{Conn: a}
	w, r := NewConn(counted, nil, 1<<20, time.Second), NewConn(b, nil, 1<<20, time.Second)
	// The first write waits until two callers wait behind it, so that
	// the next carries both whatever the machine's load (else a loaded
	// scheduler may run the writers one by one, each writing alone).
	counted.gate = func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.waiters >= 2
	}
	const writers, each = 8, 200
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			for j := range each {
				req := checkOp("lock")
				req.Id = uint64(i*each + j + 1)
				if err := w.Write(req); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	big := checkOp(string(make([]byte, 100_000)))
	big.Id = writers*each + 1
	wg.Go(func() {
		if err := w.Write(big); err != nil {
			t.Error(err)
		}
	})
	seen := map[uint64]bool{}
	for len(seen) < writers*each+1 {
		req := &fencev1.StreamRequest{}
		if err := r.Read(req); err != nil {
			t.Fatalf("after %d messages: %v", len(seen), err)
		}
		if seen[req.GetId()] {
			t.Fatalf("message %d arrived twice", req.GetId())
		}
		seen[req.GetId()] = true
		if req.GetId() == big.Id && len(req.GetCheck().GetLock()) != 100_000 {
			t.Fatalf("the big message arrived with a name of %d bytes", len(req.GetCheck().GetLock()))
		}
	}
	wg.Wait()
	if n := counted.writes(); n >= writers*each {
		t.Errorf("%d messages took %d writes", writers*each+1, n)
	} else {
		t.Logf("%d messages in %d writes", writers*each+1, n)
	}
}

type countingConn struct {
	net.Conn
	mu sync.Mutex
	n  int
	// gate, if set, holds the first write until it reports true (for ten
	// seconds at most).
	gate func() bool
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	c.n++
	first, gate := c.n == 1, c.gate
	c.mu.Unlock()
	if first && gate != nil {
		for deadline := time.Now().Add(10 * time.Second); !gate() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
	}
	return c.Conn.Write(b)
}

func (c *countingConn) writes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// A ping is answered by the far end's reader, and its pong counts as a
// frame read; neither reaches the reader as a message.
func TestPingIsAnswered(t *testing.T) {
	a, b := pair(t)
	ca, cb := NewConn(a, nil, 1024, time.Second), NewConn(b, nil, 1024, time.Second)
	ca.lastRead.Store(time.Now().Add(-time.Hour).UnixNano())
	go func() {
		_ = cb.Read(&fencev1.StreamRequest{}) // answers the ping, then waits for a message
	}()
	if err := ca.Ping(); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- ca.Read(&fencev1.StreamResponse{}) }()
	deadline := time.Now().Add(5 * time.Second)
	for ca.ReadIdle() > time.Minute {
		if time.Now().After(deadline) {
			t.Fatal("no pong")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-got:
		t.Fatalf("a pong was read as a message (%v)", err)
	case <-time.After(50 * time.Millisecond):
	}
}

// Bad input ends the read with an error (and a length over the bound is
// refused before anything is allocated for it): a frame over the bound, an unknown frame type, a ping of the wrong size,
// a frame cut short, a payload that is not the message.
func TestBadFramesFailTheRead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes []byte
		want  error
	}{
		{"over the bound", []byte{frameMessage, 0x81, 0x08}, ErrFrameTooLarge}, // 1,025 bytes
		{"huge length", []byte{frameMessage, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}, ErrFrameTooLarge},
		{"unknown type", []byte{9, 0}, nil},
		{"short ping", []byte{framePing, 2, 0, 0}, nil},
		{"cut short", []byte{frameMessage, 10, 1, 2}, io.ErrUnexpectedEOF},
		{"cut in the length", []byte{frameMessage, 0x81}, io.ErrUnexpectedEOF},
		{"not protobuf", []byte{frameMessage, 2, 0xff, 0xff}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t)
			if _, err := a.Write(tc.bytes); err != nil {
				t.Fatal(err)
			}
			_ = a.(*net.TCPConn).CloseWrite()
			err := NewConn(b, nil, 1024, time.Second).Read(&fencev1.StreamRequest{})
			if err == nil || errors.Is(err, io.EOF) {
				t.Fatalf("read %v, want an error of the frame", err)
			}
			if tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("read %v, want %v", err, tc.want)
			}
		})
	}
}

// The end of the connection between frames is io.EOF, so that a reader
// tells a peer that finished from one cut off.
func TestEndBetweenFramesIsEOF(t *testing.T) {
	a, b := pair(t)
	w := NewConn(a, nil, 1024, time.Second)
	if err := w.Write(checkOp("x")); err != nil {
		t.Fatal(err)
	}
	_ = a.(*net.TCPConn).CloseWrite()
	r := NewConn(b, bufio.NewReader(b), 1024, time.Second)
	if err := r.Read(&fencev1.StreamRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Read(&fencev1.StreamRequest{}); !errors.Is(err, io.EOF) {
		t.Fatalf("read after the last frame: %v, want io.EOF", err)
	}
}

// A write blocked by a peer that does not read gives up when the write
// timeout passes, and the stream stays broken: the connection is closed,
// so that its reader learns it at once, and later writes fail at once.
func TestBlockedWriteGivesUp(t *testing.T) {
	a, _ := pair(t) // the far end never reads
	w := NewConn(a, nil, 1024, 200*time.Millisecond)
	big := checkOp(string(make([]byte, 1<<20)))
	start := time.Now()
	var err error
	for err == nil && time.Since(start) < 30*time.Second {
		err = w.Write(big)
	}
	if err == nil {
		t.Fatal("writes to a peer that never reads went on for 30s")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the blocked write gave up after %v", took)
	}
	if err := w.Write(checkOp("x")); err == nil {
		t.Fatal("a write after the stream broke succeeded")
	}
	read := make(chan error, 1)
	go func() { read <- w.Read(&fencev1.StreamResponse{}) }()
	select {
	case err := <-read:
		if err == nil {
			t.Fatal("a read of the broken stream succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reader of a stream whose write failed still waits: the connection was left open")
	}
}

// blockWriter starts a write of a message bigger than the loopback
// socket's buffers to a far end that does not read, and returns once it
// is blocked.
func blockWriter(t *testing.T, w *Conn) {
	t.Helper()
	go func() { _ = w.Write(checkOp(string(make([]byte, 32<<20)))) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		writing := w.writing
		w.mu.Unlock()
		if writing {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the big write did not start")
		}
		time.Sleep(time.Millisecond)
	}
}

// A far end that pings and does not read the pongs gets one pong queued,
// however many pings it sends while the node's writer is blocked.
func TestPingsWithoutReadingQueueOnePong(t *testing.T) {
	a, b := pair(t)
	r := NewConn(b, nil, 1024, time.Minute)
	blockWriter(t, r)
	var burst []byte
	for range 100_000 {
		burst = append(burst, framePing, pingBytes, 1, 2, 3, 4, 5, 6, 7, 8)
	}
	burst = append(burst, frameMessage, 0)
	go func() { _, _ = a.Write(burst) }()
	if err := r.Read(&fencev1.StreamRequest{}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	queued := len(r.pending)
	r.mu.Unlock()
	if queued > 2+pingBytes {
		t.Fatalf("%d bytes of pongs queued for a far end that does not read them", queued)
	}
}

// Frames queued behind a blocked write are bounded: past maxQueued the
// writers wait for room, and every one of them learns that the stream
// broke when the blocked write times out.
func TestQueueBehindABlockedWriteIsBounded(t *testing.T) {
	a, _ := pair(t)
	w := NewConn(a, nil, 1024, 2*time.Second)
	blockWriter(t, w)
	big := checkOp(string(make([]byte, 1<<20)))
	const writers = 40
	errs := make(chan error, writers)
	for range writers {
		go func() { errs <- w.Write(big) }()
	}
	time.Sleep(500 * time.Millisecond)
	w.mu.Lock()
	queued := len(w.pending)
	w.mu.Unlock()
	if queued > maxQueued+(1<<20)+16 {
		t.Fatalf("%d MiB queued behind a blocked write", queued>>20)
	}
	for range writers {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a write to a far end that never reads succeeded")
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a writer still waits 30s after the blocked write's timeout")
		}
	}
}

// A far end that reads slowly but steadily keeps the stream: the write
// timeout bounds a write's lack of progress, not how long a big write
// takes.
func TestSlowReaderKeepsTheStream(t *testing.T) {
	a, b := pair(t)
	w := NewConn(a, nil, 1024, 1500*time.Millisecond)
	go func() {
		buf := make([]byte, 128<<10)
		for {
			if _, err := b.Read(buf); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond) // at most 6.5 MB/s
		}
	}()
	big := checkOp(string(make([]byte, 24<<20))) // some 4s at that rate
	if err := w.Write(big); err != nil {
		t.Fatalf("a write to a far end that reads slowly failed: %v", err)
	}
}

// The reader answering a ping writes no one else's frames: when callers
// wait for what is queued (a writer has just handed the rest on to them),
// the pong goes with their frames, written by one of them, and the reader
// goes on reading. Here a caller's frame waits, as in that moment.
func TestReaderWritesOnlyItsPong(t *testing.T) {
	a, b := pair(t)
	r := NewConn(b, nil, 1024, time.Second)
	r.mu.Lock()
	r.pending = append(r.pending, frameMessage, 0)
	r.waiters = 1
	r.mu.Unlock()
	if _, err := a.Write([]byte{framePing, pingBytes, 1, 2, 3, 4, 5, 6, 7, 8, frameMessage, 0}); err != nil {
		t.Fatal(err)
	}
	if err := r.Read(&fencev1.StreamRequest{}); err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	queued, taken := len(r.pending), r.taken
	r.mu.Unlock()
	if taken != 0 || queued != 2+2+pingBytes {
		t.Fatalf("the reader wrote %d writes, leaving %d bytes queued: it wrote a waiting caller's frame", taken, queued)
	}
}

// A frame that declares a big length and brings few bytes costs about
// what it brought, not what it declared.
func TestDeclaredLengthIsNotAllocatedAhead(t *testing.T) {
	a, b := pair(t)
	frame := []byte{frameMessage}
	frame = binary.AppendUvarint(frame, 8<<20)
	frame = append(frame, make([]byte, 100)...)
	if _, err := a.Write(frame); err != nil {
		t.Fatal(err)
	}
	_ = a.Close()
	r := NewConn(b, nil, 16<<20, time.Second)
	if err := r.Read(&fencev1.StreamRequest{}); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("read %v, want io.ErrUnexpectedEOF", err)
	}
	if c := cap(r.rbuf); c > 1<<20 {
		t.Fatalf("a frame that brought 100 of its 8 MiB took a buffer of %d bytes", c)
	}
}

// No input makes a reader panic or hang once the connection ends: every
// sequence of bytes is frames, or an error.
func FuzzRead(f *testing.F) {
	f.Add([]byte{frameMessage, 0})
	f.Add([]byte{framePing, 8, 1, 2, 3, 4, 5, 6, 7, 8, frameMessage, 2, 8, 1})
	f.Add([]byte{frameMessage, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		a, b := net.Pipe()
		go func() {
			_, _ = a.Write(data)
			// Pongs the reader writes back are drained, then the end.
			_ = a.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
			_, _ = io.Copy(io.Discard, a)
			_ = a.Close()
		}()
		r := NewConn(b, nil, 4096, time.Second)
		for range len(data) + 1 {
			if err := r.Read(&fencev1.StreamRequest{}); err != nil {
				return
			}
		}
		t.Fatalf("%d reads of %d bytes all succeeded", len(data)+1, len(data))
	})
}

// Callers queued behind a write that the far end holds up keep to their
// own contexts: one waiting for its frame to be written and one waiting
// for room in the queue each give up when their context ends, long before
// the write timeout, and the stream is not broken. A frame that was
// queued still goes out, after the frames before it, once the far end
// reads, written by the Conn itself since its caller left; one that found
// no room was never queued.
func TestWaitingWritersKeepToTheirContexts(t *testing.T) {
	a, b := pair(t)
	w := NewConn(a, nil, 1024, time.Minute)
	blockWriter(t, w) // 32 MiB

	giveUp := func(m *fencev1.StreamRequest, queued bool) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		err := w.WriteContext(ctx, m)
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrLeftQueued) != queued {
			t.Fatalf("a write behind a blocked one returned %v, want its context's deadline (queued: %v)", err, queued)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("a write whose context ended after 200ms returned after %v", took)
		}
	}
	giveUp(checkOp("queued"), true) // its frame waits in the queue
	// Past maxQueued with the frame before it: waits for room, never queued.
	giveUp(checkOp("no room"+string(make([]byte, maxQueued))), false)
	if w.broken.Load() {
		t.Fatal("callers giving up broke the stream")
	}

	r := NewConn(b, nil, 64<<20, time.Minute)
	_ = b.SetReadDeadline(time.Now().Add(20 * time.Second))
	var got []string
	for range 2 {
		m := &fencev1.StreamRequest{}
		if err := r.Read(m); err != nil {
			t.Fatal(err)
		}
		got = append(got, m.GetCheck().GetLock()[:min(len(m.GetCheck().GetLock()), 15)])
	}
	if err := w.Write(checkOp("after")); err != nil {
		t.Fatalf("a write once the far end reads: %v", err)
	}
	m := &fencev1.StreamRequest{}
	if err := r.Read(m); err != nil {
		t.Fatal(err)
	}
	got = append(got, m.GetCheck().GetLock())
	want := []string{"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "queued", "after"}
	if !slices.Equal(got, want) {
		t.Fatalf("the far end read %q, want %q", got, want)
	}
}

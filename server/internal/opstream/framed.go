package opstream

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/wire"
)

// Upgrades takes over the connections of the framed streams a node serves
// (a client asks for one with an HTTP/1.1 upgrade to wire.Protocol), and
// counts them, so that a node's Close waits for them as
// http.Server.Shutdown waits for the calls it serves. Its zero value is
// ready to use.
type Upgrades struct {
	mu     sync.Mutex
	closed bool                  // no more streams
	gaveUp bool                  // Close stopped waiting and closed conns
	conns  map[net.Conn]struct{} // the connections of the streams served
	wg     sync.WaitGroup
}

// Serve takes over the connection of w, answers the upgrade with the
// headers w holds (the group's id, say), and calls serve with the framed
// connection, its reads bounded by maxRead bytes a frame and its writes
// by writeTimeout; the connection is closed when serve returns. It returns
// an error, for the caller to answer, only while nothing was written: the
// node closing, or a connection that cannot be taken over.
func (u *Upgrades) Serve(w http.ResponseWriter, maxRead int, writeTimeout time.Duration, serve func(Framed)) error {
	if !u.enter() {
		return fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		u.exit(nil)
		return fmt.Errorf("%w: this connection cannot be taken over for the framed stream: %v", fence.ErrInvalidArgument, err)
	}
	defer u.exit(conn)
	if !u.serving(conn) {
		return nil
	}
	// The server's read deadline bounded the request's headers; a stream
	// lives as long as its client keeps it, and each write is bounded by
	// writeTimeout (wire.Conn).
	_ = conn.SetDeadline(time.Time{})
	if err := writeSwitch(brw.Writer, w.Header()); err != nil {
		return nil // the client went away
	}
	serve(Framed{wire.NewConn(conn, takeReader(brw.Reader, conn), maxRead, writeTimeout)})
	return nil
}

// takeReader returns a reader of conn that begins with what the HTTP
// server's reader r holds already. r reads through the server's hold on
// the connection, which ends the request's context at the first error a
// read meets, EOF included: a client that closes its side of the stream
// would have the operations it sent cancelled, not answered.
func takeReader(r *bufio.Reader, conn net.Conn) *bufio.Reader {
	n := r.Buffered()
	if n == 0 {
		return bufio.NewReader(conn)
	}
	held, _ := r.Peek(n)
	return bufio.NewReader(io.MultiReader(bytes.NewReader(bytes.Clone(held)), conn))
}

// writeSwitch answers an upgrade to wire.Protocol, with the headers h.
func writeSwitch(bw *bufio.Writer, h http.Header) error {
	_, _ = bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + wire.Protocol + "\r\n")
	_ = h.Write(bw)
	_, _ = bw.WriteString("\r\n")
	return bw.Flush()
}

// enter counts a stream about to be served, unless Close was called.
func (u *Upgrades) enter() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return false
	}
	u.wg.Add(1)
	return true
}

// serving tracks conn, the connection of a stream entered, until exit;
// it reports false, and closes conn, when Close gave up on the streams
// meanwhile.
func (u *Upgrades) serving(conn net.Conn) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.gaveUp {
		_ = conn.Close()
		return false
	}
	if u.conns == nil {
		u.conns = map[net.Conn]struct{}{}
	}
	u.conns[conn] = struct{}{}
	return true
}

// exit counts the end of a stream entered, and closes its connection.
func (u *Upgrades) exit(conn net.Conn) {
	if conn != nil {
		_ = conn.Close()
		u.mu.Lock()
		delete(u.conns, conn)
		u.mu.Unlock()
	}
	u.wg.Done()
}

// Close refuses further streams and waits, within ctx, for those open to
// end (the caller ends them first, through the contexts they are served
// under); when ctx ends first, it closes their connections, so that none
// outlives the node (a stream stuck writing to a client that does not
// read, say), and waits a moment more for their operations to return.
func (u *Upgrades) Close(ctx context.Context) {
	u.mu.Lock()
	u.closed = true
	u.mu.Unlock()
	ended := make(chan struct{})
	go func() {
		u.wg.Wait()
		close(ended)
	}()
	select {
	case <-ended:
		return
	case <-ctx.Done():
	}
	u.mu.Lock()
	u.gaveUp = true
	conns := make([]net.Conn, 0, len(u.conns))
	for conn := range u.conns {
		conns = append(conns, conn)
	}
	u.mu.Unlock()
	for _, conn := range conns {
		_ = wire.Bare(conn).Close()
	}
	select {
	case <-ended:
	case <-time.After(time.Second):
	}
}

package server

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/internal/wire"
)

// The session stream framed on the connection (docs/design.md, The
// session stream): a client asks for it with an HTTP/1.1 upgrade to
// wire.Protocol on the stream's path, and the same operations then travel
// as frames on the bare connection, each answered from the goroutine that
// ran it. Everything but the transport is the Connect stream's
// (serveStream).

// framedSilence is how long a framed stream may go without a frame from
// its client (which pings after 10 seconds of quiet) before the node
// drops it: a client host gone, or a client process stopped. A variable
// for tests; a Server reads it when made.
var framedSilence = 45 * time.Second

// framedStreams counts a node's framed streams, so that Close waits for
// them as http.Server.Shutdown waits for the calls it serves.
type framedStreams struct {
	silence time.Duration // framedSilence when the node was made

	mu     sync.Mutex
	closed bool                  // no more streams
	gaveUp bool                  // close stopped waiting and closed conns
	conns  map[net.Conn]struct{} // the connections of the streams served
	wg     sync.WaitGroup
}

// enter counts a stream about to be served, unless the node is closing.
func (f *framedStreams) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.wg.Add(1)
	return true
}

// serving tracks conn, the connection of a stream entered, until exit;
// it reports false, and closes conn, when close gave up on the streams
// meanwhile.
func (f *framedStreams) serving(conn net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gaveUp {
		_ = conn.Close()
		return false
	}
	if f.conns == nil {
		f.conns = map[net.Conn]struct{}{}
	}
	f.conns[conn] = struct{}{}
	return true
}

// exit counts the end of a stream entered, and closes its connection.
func (f *framedStreams) exit(conn net.Conn) {
	if conn != nil {
		_ = conn.Close()
		f.mu.Lock()
		delete(f.conns, conn)
		f.mu.Unlock()
	}
	f.wg.Done()
}

// close refuses further streams and waits, within ctx, for those open to
// end (the node's done channel, closed before, ends them); when ctx ends
// first, it closes their connections, so that none outlives the node
// (a stream stuck writing to a client that does not read, say), and
// waits a moment more for their operations to return.
func (f *framedStreams) close(ctx context.Context) {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	ended := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(ended)
	}()
	select {
	case <-ended:
		return
	case <-ctx.Done():
	}
	f.mu.Lock()
	f.gaveUp = true
	conns := make([]net.Conn, 0, len(f.conns))
	for conn := range f.conns {
		conns = append(conns, conn)
	}
	f.mu.Unlock()
	for _, conn := range conns {
		_ = wire.Bare(conn).Close()
	}
	select {
	case <-ended:
	case <-time.After(time.Second):
	}
}

// framedStreams serves the framed session stream to the requests that ask
// for it, and passes every other request to next.
func (s *Server) framedStreams(next http.Handler) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/"+fencev1connect.StreamServiceName+"/Session" || !wire.Asked(r.Header) {
			next.ServeHTTP(w, r)
			return
		}
		if err := s.serveFramed(w, r); err != nil {
			errs.Write(w, r, rpcerr.ToConnect(s.leaderHint(err)))
		}
	})
}

// serveFramed serves one framed stream. It returns an error, for the
// caller to answer, only while nothing was written: a refusal (not the
// leader, no credential) is answered as the Connect stream's open would
// be, with the connection still HTTP.
func (s *Server) serveFramed(w http.ResponseWriter, r *http.Request) error {
	term := s.leaderTerm.current()
	if r.ProtoMajor != 1 {
		return fmt.Errorf("%w: the framed session stream is an HTTP/1.1 upgrade; over HTTP/2 open %s", fence.ErrInvalidArgument, fencev1connect.StreamServiceSessionProcedure)
	}
	if !s.leaderReady.Load() {
		return s.notReady()
	}
	ctx := withClientAddr(r.Context(), r.RemoteAddr, r.Header)
	ctx, err := s.checkStreamOpen(ctx, r.RemoteAddr, r.Header)
	if err != nil {
		return err
	}
	if !s.framed.enter() {
		return fmt.Errorf("%w: the node is shutting down", fence.ErrUnavailable)
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		s.framed.exit(nil)
		return fmt.Errorf("%w: this connection cannot be taken over for the framed stream: %v", fence.ErrInvalidArgument, err)
	}
	defer s.framed.exit(conn)
	if !s.framed.serving(conn) {
		return nil
	}
	// The server's read deadline bounded the request's headers; a stream
	// lives as long as its client keeps it (framedSilence), and each
	// write is bounded by the write timeout (wire.Conn), or, with none,
	// by the silence after which a stream is dropped: a client that
	// reads nothing for as long is as gone as one that says nothing.
	_ = conn.SetDeadline(time.Time{})
	if err := writeSwitch(brw.Writer, w.Header()); err != nil {
		return nil // the client went away
	}
	writeTimeout := s.cfg.WriteTimeout
	if writeTimeout == 0 {
		writeTimeout = s.framed.silence
	}
	fc := wire.NewConn(conn, brw.Reader, s.cfg.MaxRequestBytes, writeTimeout)
	if err := s.serveStream(ctx, term, framedStream{fc}); err != nil {
		// Why the stream ended, as the Connect stream's trailers say it,
		// to a client that still reads.
		_ = fc.Finish(&fencev1.StreamResponse{Error: rpcerr.ToStream(s.leaderHint(err))}, time.Second)
	}
	return nil
}

// writeSwitch answers an upgrade to wire.Protocol, with the headers the
// handlers before this one set (the group's id).
func writeSwitch(bw *bufio.Writer, h http.Header) error {
	_, _ = bw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + wire.Protocol + "\r\n")
	_ = h.Write(bw)
	_, _ = bw.WriteString("\r\n")
	return bw.Flush()
}

// framedStream is a stream framed on its connection.
type framedStream struct{ *wire.Conn }

func (f framedStream) Receive() (*fencev1.StreamRequest, error) {
	req := &fencev1.StreamRequest{}
	if err := f.Read(req); err != nil {
		return nil, err
	}
	return req, nil
}

func (f framedStream) Send(resp *fencev1.StreamResponse) error {
	return f.Write(resp)
}

package server

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/internal/fsmpb"
)

// stalledBody is an HTTP/1.1 call that announces a 100-byte body and sends
// one byte of it.
const stalledBody = "POST /" + fencev1connect.LockServiceName + "/ListLocks HTTP/1.1\r\n" +
	"Host: fence\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"

// dialRaw opens a plain TCP connection to s's API and writes req on it.
func dialRaw(tb testing.TB, s *Server, req string) net.Conn {
	tb.Helper()
	c, err := net.Dial("tcp", s.Addr())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		tb.Fatal(err)
	}
	return c
}

// closedWithin reads c until the server closes it, and reports how long
// that took from start; it fails the test if c is still open after limit.
func closedWithin(tb testing.TB, c net.Conn, start time.Time, limit time.Duration) time.Duration {
	tb.Helper()
	c.SetReadDeadline(start.Add(limit))
	_, err := io.Copy(io.Discard, c)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		tb.Fatalf("connection still open after %v", limit)
	}
	return time.Since(start)
}

// A client that sends part of a request body and stops is cut off once
// ReadTimeout has passed, and its connection is closed.
func TestStalledBodyIsCutOff(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.ReadTimeout = 300 * time.Millisecond })
	start := time.Now()
	c := dialRaw(t, s, stalledBody)
	took := closedWithin(t, c, start, 5*time.Second)
	t.Logf("stalled HTTP/1.1 body: connection closed after %v", took)
	if took < 250*time.Millisecond {
		t.Fatalf("connection closed after %v, before the read timeout", took)
	}
}

// Over HTTP/2 a stalled body fails its own stream once ReadTimeout has
// passed; the connection's other calls go on.
func TestStalledBodyIsCutOffHTTP2(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.ReadTimeout = 300 * time.Millisecond })
	h2c := h2cClient(t)
	body, stall := io.Pipe()
	defer stall.Close()
	go io.WriteString(stall, "{")
	req, err := http.NewRequest(http.MethodPost, "http://"+s.Addr()+"/"+fencev1connect.LockServiceName+"/ListLocks", body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		resp, err := h2c.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a stalled HTTP/2 body was not cut off within 5s")
	}
	t.Logf("stalled HTTP/2 body: answered after %v", time.Since(start))
	// The same connection still carries calls.
	locks := fencev1connect.NewLockServiceClient(h2c, "http://"+s.Addr())
	if _, err := locks.ListLocks(context.Background(), connect.NewRequest(&fencev1.ListLocksRequest{})); err != nil {
		t.Fatalf("a call after the stalled one: %v", err)
	}
}

// A keep-alive connection that carries no call is closed after IdleTimeout.
func TestIdleConnectionIsClosed(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	c := dialRaw(t, s, "GET /healthz HTTP/1.1\r\nHost: fence\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Close || strings.TrimSpace(string(body)) != "ok" {
		t.Fatalf("/healthz: close=%v %q, want a kept-alive ok", resp.Close, body)
	}
	idle := time.Now()
	took := closedWithin(t, c, idle, 5*time.Second)
	t.Logf("idle keep-alive connection closed after %v", took)
	if took < 250*time.Millisecond {
		t.Fatalf("idle connection closed after %v, before the idle timeout", took)
	}
}

// ReadTimeout bounds sending the request, not the answer: an acquire that
// waits longer than it is granted, over HTTP/1.1 and over HTTP/2.
func TestBlockedAcquireOutlivesReadTimeout(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.ReadTimeout = 200 * time.Millisecond })
	for name, hc := range map[string]*http.Client{"HTTP/1.1": http.DefaultClient, "HTTP/2": h2cClient(t)} {
		t.Run(name, func(t *testing.T) {
			a := newAPI(t, s)
			a.locks = fencev1connect.NewLockServiceClient(hc, "http://"+s.Addr(), connect.WithInterceptors(a.secrets))
			holder, waiter := a.session(time.Minute), a.session(time.Minute)
			token := a.mustAcquire(holder, name)
			p := a.acquireAsync(context.Background(), &fencev1.AcquireRequest{SessionId: waiter, Lock: name})
			time.Sleep(4 * s.cfg.ReadTimeout)
			if p.returned() {
				_, err := p.result(t)
				t.Fatalf("the blocked acquire returned before the release: %v", err)
			}
			if err := a.release(holder, name, token); err != nil {
				t.Fatal(err)
			}
			if _, err := p.result(t); err != nil {
				t.Fatalf("the blocked acquire, after %v: %v", 4*s.cfg.ReadTimeout, err)
			}
		})
	}
}

// h2cClient is an HTTP/2 client without TLS, as gRPC clients use.
func h2cClient(tb testing.TB) *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	tr := &http.Transport{Protocols: &p}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// openFDs counts this process's open file descriptors, where the system
// lists them.
func openFDs(tb testing.TB) int {
	tb.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		tb.Skipf("cannot count open files: %v", err)
	}
	return len(fds)
}

// More stalled clients than MaxConnections hold no more than that many of
// the leader's descriptors, are cut off after ReadTimeout and leave room
// for a normal call; meanwhile raft commits and snapshots.
func TestStalledFloodIsBounded(t *testing.T) {
	const limit, flood = 50, 120
	readTimeout := 500 * time.Millisecond
	c := startCluster(t, 3, func(c *Config) {
		c.MaxConnections = limit
		c.ReadTimeout = readTimeout
	})
	leader := c.leader()
	before := openFDs(t)
	start := time.Now()
	stalled := make([]net.Conn, flood)
	for i := range stalled {
		stalled[i] = dialRaw(t, leader, stalledBody)
	}
	time.Sleep(100 * time.Millisecond) // for the leader to accept what it will
	// Each stalled connection holds one descriptor on the client's side,
	// and one on the leader's once accepted.
	accepted := openFDs(t) - before - flood
	t.Logf("%d stalled connections: %d accepted by the leader", flood, accepted)
	if accepted > limit+30 {
		t.Fatalf("the leader holds %d stalled connections, over its limit of %d", accepted, limit)
	}
	if open := leader.conns.Open(); open != limit {
		t.Fatalf("the leader has %d API connections open, want its limit of %d", open, limit)
	}

	// Raft, on its own port, commits and snapshots.
	if _, err := leader.apply(&fsmpb.Command{Op: &fsmpb.Command_CreateSession{CreateSession: &fsmpb.CreateSession{TtlNs: int64(time.Minute)}}}); err != nil {
		t.Fatalf("a write while the API is saturated: %v", err)
	}
	if err := leader.node.raft.Snapshot().Error(); err != nil {
		t.Fatalf("a snapshot while the API is saturated: %v", err)
	}
	if elapsed := time.Since(start); elapsed > readTimeout {
		t.Logf("raft took until %v, past the first cut-off: the API may no longer have been saturated", elapsed)
	}

	// A normal call waits for a free connection, within a few cut-offs.
	bound := time.Duration(flood/limit+2)*readTimeout + 2*time.Second
	callStart := time.Now()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	locks := fencev1connect.NewLockServiceClient(&http.Client{Transport: tr}, "http://"+leader.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := locks.ListLocks(ctx, connect.NewRequest(&fencev1.ListLocksRequest{})); err != nil {
		t.Fatalf("a normal call during the flood: %v", err)
	}
	t.Logf("a normal call during the flood took %v", time.Since(callStart))

	for _, conn := range stalled {
		closedWithin(t, conn, start, bound)
	}
	t.Logf("all %d stalled connections closed within %v", flood, time.Since(start))
}

package server

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/internal/rpcerr"
	"github.com/fencelock/fence/internal/wire"
)

// openFramedStream opens the framed stream at url (a streamOpener): an
// HTTP/1.1 upgrade on a connection of its own. A node that does not
// switch answers with a Connect error, returned as a *connect.Error.
func openFramedStream(tb testing.TB, ctx context.Context, url string, header http.Header) (*rawStream, error) {
	tb.Helper()
	conn, br, err := upgradeAt(ctx, url, header)
	if err != nil {
		return nil, err
	}
	tb.Cleanup(func() { conn.Close() })
	fc := wire.NewConn(conn, br, 64<<20, 10*time.Second)
	first := &fencev1.StreamResponse{}
	if err := fc.Read(first); err != nil {
		return nil, err
	}
	send := func(req *fencev1.StreamRequest) error { return fc.Write(req) }
	recv := func() (*fencev1.StreamResponse, error) {
		resp := &fencev1.StreamResponse{}
		if err := fc.Read(resp); err != nil {
			return nil, err
		}
		if resp.GetId() == 0 && resp.GetError() != nil {
			return nil, rpcerr.FromStream(resp.GetError()) // why the node ended the stream
		}
		return resp, nil
	}
	return newRawStream(tb, first, send, recv), nil
}

// upgradeAt sends the framed stream's upgrade to url and returns the
// connection once the node switched.
func upgradeAt(ctx context.Context, url string, header http.Header) (net.Conn, *bufio.Reader, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/fence.v1.StreamService/Session", nil)
	if err != nil {
		return nil, nil, err
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", wire.Protocol)
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", req.URL.Host)
	if err != nil {
		return nil, nil, err
	}
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		return nil, nil, connectErrorOf(resp)
	}
	if !wire.Switched(resp.Header) {
		conn.Close()
		return nil, nil, fmt.Errorf("101 without Upgrade: %s: %v", wire.Protocol, resp.Header)
	}
	return conn, br, nil
}

// connectErrorOf reads a Connect error from a response's JSON body, with
// its ErrorDetail.
func connectErrorOf(resp *http.Response) error {
	var body struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Details []struct {
			Type  string `json:"type"`
			Value string `json:"value"`
		} `json:"details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("status %d, body not a Connect error: %w", resp.StatusCode, err)
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(body.Code)); err != nil {
		return fmt.Errorf("status %d, code %q: %w", resp.StatusCode, body.Code, err)
	}
	ce := connect.NewError(code, errors.New(body.Message))
	for _, d := range body.Details {
		raw, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(d.Value, "="))
		detail := &fencev1.ErrorDetail{}
		if err == nil && proto.Unmarshal(raw, detail) == nil {
			if cd, err := connect.NewErrorDetail(detail); err == nil {
				ce.AddDetail(cd)
			}
		}
	}
	return ce
}

// The framed stream is what clients get by default (the Go client opens
// it), and it is counted by transport in fence_stream_opens_total.
func TestFramedStreamCounted(t *testing.T) {
	s := startTestServer(t, nil)
	rs := mustOpen(t, openFramedStream, s)
	rs.session(10 * time.Second)
	mustOpenStream(t, s).session(10 * time.Second)
	samples := scrape(t, "http://"+s.Addr()+"/metrics")
	for _, want := range []string{`fence_stream_opens_total{transport="framed"}`, `fence_stream_opens_total{transport="http2"}`} {
		if samples[want] != 1 {
			t.Errorf("%s = %v, want 1", want, samples[want])
		}
	}
}

// A client that sends nothing, not even a ping, for framedSilence (a host
// gone, a process stopped) has its stream dropped; one that pings keeps it.
func TestFramedStreamDropsSilentClients(t *testing.T) {
	saved := framedSilence
	framedSilence = 600 * time.Millisecond
	t.Cleanup(func() { framedSilence = saved })
	s := startTestServer(t, nil)

	pinging, _, err := upgradeAt(context.Background(), "http://"+s.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pinging.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		fc := wire.NewConn(pinging, nil, 1<<20, time.Second)
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
				_ = fc.Ping()
			}
		}
	}()

	silent, br, err := upgradeAt(context.Background(), "http://"+s.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	fc := wire.NewConn(silent, br, 1<<20, time.Second)
	start := time.Now()
	var end error
	for end == nil {
		resp := &fencev1.StreamResponse{}
		if end = fc.Read(resp); end == nil && resp.GetId() == 0 && resp.GetError() != nil {
			end = rpcerr.FromStream(resp.GetError())
		}
	}
	if !errors.Is(end, fence.ErrUnavailable) {
		t.Fatalf("the silent client's stream ended with %v", end)
	}
	if took := time.Since(start); took < framedSilence || took > 10*framedSilence {
		t.Fatalf("the silent client's stream ended after %v, framedSilence is %v", took, framedSilence)
	}
	if n := scrape(t, "http://"+s.Addr()+"/metrics")["fence_streams"]; n != 1 {
		t.Fatalf("fence_streams = %v after the silent stream ended, want the pinging one", n)
	}
}

// A client that stops reading its framed stream, on a node with no write
// timeout, has the stream dropped all the same once the node's writes to
// it stall for framedSilence: it holds no goroutine, no connection and no
// operation slot for good.
func TestFramedStreamDropsClientsThatDoNotRead(t *testing.T) {
	saved := framedSilence
	framedSilence = 600 * time.Millisecond
	t.Cleanup(func() { framedSilence = saved })
	s := startTestServer(t, func(c *Config) { c.WriteTimeout = 0 })
	ctx := context.Background()
	value := make([]byte, 200<<10)
	put := &fencev1.StreamRequest{Id: 1, Op: &fencev1.StreamRequest_Put{Put: &fencev1.PutRequest{Key: "big", Value: value}}}
	conn, br, err := upgradeAt(ctx, "http://"+s.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fc := wire.NewConn(conn, br, 64<<20, 10*time.Second)
	for _, m := range []proto.Message{&fencev1.StreamResponse{}, put, &fencev1.StreamResponse{}} {
		if req, ok := m.(*fencev1.StreamRequest); ok {
			err = fc.Write(req)
		} else {
			err = fc.Read(m)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := scrape(t, "http://"+s.Addr()+"/metrics")["fence_streams"]; n != 1 {
		t.Fatalf("fence_streams = %v with the stream open, want 1", n)
	}
	// Gets of the big value, never read: the node's writes fill the
	// sockets' buffers and stall.
	start := time.Now()
	go func() {
		for id := uint64(2); id < 60; id++ { // 12 MiB of answers: more than the sockets hold
			if fc.Write(&fencev1.StreamRequest{Id: id, Op: &fencev1.StreamRequest_Get{Get: &fencev1.GetRequest{Key: "big"}}}) != nil {
				return
			}
		}
	}()
	deadline := time.Now().Add(15 * time.Second)
	for scrape(t, "http://"+s.Addr()+"/metrics")["fence_streams"] != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stream of a client that does not read lives on 15s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Dropped for silence (checked every 200ms) once its writes, too, made
	// no progress for framedSilence.
	if took := time.Since(start); took < framedSilence {
		t.Fatalf("the stream was dropped after %v, before framedSilence (%v)", took, framedSilence)
	}
}

// A framed client that closes its connection (the Go client does when its
// stream ends, and a killed process's kernel does the same) while an
// Acquire of it waits has that wait given up at once, as a unary caller
// that goes away has. (Found in review: for a while the framed stream read
// the connection past net/http, whose end of reading no longer cancelled
// anything, and the wait stayed queued until the silent stream was
// dropped, 45 to 60 s later, and could be granted the lock meanwhile.)
func TestAFramedClientThatGoesAwayGivesUpItsWait(t *testing.T) {
	s := startTestServer(t, nil)
	holder := mustOpen(t, openFramedStream, s)
	a := holder.session(30 * time.Second)
	holder.mustDo(acquireOp(a, "L", false))

	conn, br, err := upgradeAt(context.Background(), "http://"+s.Addr(), nil)
	if err != nil {
		t.Fatal(err)
	}
	fc := wire.NewConn(conn, br, 64<<20, 10*time.Second)
	first := &fencev1.StreamResponse{}
	if err := fc.Read(first); err != nil {
		t.Fatal(err)
	}
	rs := newRawStream(t, first, func(r *fencev1.StreamRequest) error { return fc.Write(r) }, func() (*fencev1.StreamResponse, error) {
		resp := &fencev1.StreamResponse{}
		if err := fc.Read(resp); err != nil {
			return nil, err
		}
		if resp.GetId() == 0 && resp.GetError() != nil {
			return nil, rpcerr.FromStream(resp.GetError())
		}
		return resp, nil
	})
	b := rs.session(30 * time.Second)
	wait := acquireOp(b, "L", false)
	wait.GetAcquire().RequestId = 9
	rs.start(wait)
	waitFor(t, "b to queue", func() bool { return waitersOf(s, "L") == 1 })

	_ = conn.Close() // the client goes away (FIN, no RST: nothing unread)

	waitForWithin(t, 5*time.Second, "the vanished client's wait to be given up", func() bool { return waitersOf(s, "L") == 0 })
}

package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
	"github.com/fencelock/fence/client"
)

// h2Window is the smallest HTTP/2 receive window Go's transport takes.
const h2Window = 65535

// h2Conn is a client's HTTP/2 connection that keeps count of its
// connection-level flow-control window: the DATA bytes it read, and the
// window its WINDOW_UPDATE frames gave, from the frames' headers.
type h2Conn struct {
	net.Conn
	mu      sync.Mutex
	in, out h2Frames
	data    int // DATA payload read
	granted int // window given: the initial one and the updates
}

// h2Frames follows the frames of one direction of a connection.
type h2Frames struct {
	skip    int    // bytes still to skip: the client's preface
	head    []byte // of the frame being read
	left    int    // of its payload
	payload []byte // of a WINDOW_UPDATE frame
}

// feed follows b and calls frame with each frame's type, stream and (for
// a WINDOW_UPDATE) payload, once its header (and that payload) is read.
func (f *h2Frames) feed(b []byte, frame func(typ byte, stream uint32, length int, payload []byte)) {
	for len(b) > 0 {
		switch {
		case f.skip > 0:
			k := min(f.skip, len(b))
			f.skip, b = f.skip-k, b[k:]
		case len(f.head) < 9:
			k := min(9-len(f.head), len(b))
			f.head, b = append(f.head, b[:k]...), b[k:]
			if len(f.head) == 9 {
				f.left = int(f.head[0])<<16 | int(f.head[1])<<8 | int(f.head[2])
				f.payload = f.payload[:0]
			}
		default:
			k := min(f.left, len(b))
			if f.head[3] == 0x8 { // WINDOW_UPDATE
				f.payload = append(f.payload, b[:k]...)
			}
			f.left, b = f.left-k, b[k:]
		}
		if len(f.head) == 9 && f.left == 0 {
			length := int(f.head[0])<<16 | int(f.head[1])<<8 | int(f.head[2])
			frame(f.head[3], binary.BigEndian.Uint32(f.head[5:9])&(1<<31-1), length, f.payload)
			f.head = f.head[:0]
		}
	}
}

func (c *h2Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.in.feed(p[:n], func(typ byte, _ uint32, length int, _ []byte) {
		if typ == 0x0 { // DATA
			c.data += length
		}
	})
	return n, err
}

func (c *h2Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.out.feed(p, func(typ byte, stream uint32, _ int, payload []byte) {
		if typ == 0x8 && stream == 0 {
			c.granted += int(binary.BigEndian.Uint32(payload) & (1<<31 - 1))
		}
	})
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// windowLeft is how many more DATA bytes the node may send.
func (c *h2Conn) windowLeft() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.granted - c.data
}

// http2Preface is what a client sends first on an HTTP/2 connection.
const http2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// smallWindowKV is a KV client on one HTTP/2 connection, with the
// smallest receive window, so that a node writing to it blocks soon when
// the client does not read. The connection, dialled at the first call,
// comes on the channel.
func smallWindowKV(t *testing.T, s *Server) (fencev1connect.KVServiceClient, <-chan *h2Conn) {
	var protocols http.Protocols
	protocols.SetUnencryptedHTTP2(true)
	dialled := make(chan *h2Conn, 1)
	tr := &http.Transport{
		Protocols: &protocols,
		HTTP2:     &http.HTTP2Config{MaxReceiveBufferPerConnection: h2Window},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			hc := &h2Conn{Conn: c, granted: h2Window, out: h2Frames{skip: len(http2Preface)}}
			select {
			case dialled <- hc:
			default:
				t.Error("the client dialled a second connection")
			}
			return hc, nil
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	return fencev1connect.NewKVServiceClient(&http.Client{Transport: tr}, "http://"+s.Addr()), dialled
}

func (s *Server) numWatchers() int {
	s.watches.mu.Lock()
	defer s.watches.mu.Unlock()
	return len(s.watches.watchers)
}

// A KV watch sends nothing committed after its token was revoked, even
// when the revocation came while the watch was busy sending: a watch
// opened just before it (its first answer held up by the connection's
// flow control, between the open's check and the watching of auth
// changes: it used to miss the revocation for good), and a watch held up
// sending a large change (its select used to take the next change or the
// auth change at random). Each ends with Unauthenticated instead of
// sending the key put after the revocation.
func TestWatchSendsNothingAfterItsTokenIsRevoked(t *testing.T) {
	// Several connections, so that a watch that takes the change or the
	// auth change at random is caught with odds of 1 - 2^-numConns.
	const numConns = 4
	s := startTestServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	root, _, token := enableAuthWithUser(t, s, "reader", perm(client.PermKV, client.Read, "a/"))
	watch := func(kv fencev1connect.KVServiceClient) *connect.ServerStreamForClient[fencev1.WatchResponse] {
		req := connect.NewRequest(&fencev1.WatchRequest{Prefix: "a/"})
		req.Header().Set("Authorization", "Bearer "+token)
		stream, err := kv.Watch(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return stream
	}
	type conn struct {
		kv            fencev1connect.KVServiceClient
		conn          *h2Conn
		busy, opening *connect.ServerStreamForClient[fencev1.WatchResponse]
	}
	conns := make([]conn, numConns)
	for i := range conns {
		c := &conns[i]
		var dialled <-chan *h2Conn
		c.kv, dialled = smallWindowKV(t, s)
		c.busy = watch(c.kv)
		defer c.busy.Close()
		if !c.busy.Receive() {
			t.Fatalf("the watch did not start: %v", c.busy.Err())
		}
		c.conn = <-dialled
	}
	// A change larger than the connections' windows (and random, as it
	// may be sent compressed): each busy watch sends what its window
	// takes and waits for the client to read.
	big := make([]byte, 200<<10)
	rand.Read(big)
	if _, err := root.KV().Put(ctx, "a/big", big); err != nil {
		t.Fatal(err)
	}
	for _, c := range conns {
		waitFor(t, "a connection's window to fill", func() bool { return c.conn.windowLeft() == 0 })
	}
	// On each full connection, a watch that passes its check and cannot
	// send its first answer.
	for i := range conns {
		conns[i].opening = watch(conns[i].kv)
		defer conns[i].opening.Close()
	}
	waitFor(t, "the opening watches to pass their check", func() bool { return s.numWatchers() == 2*numConns })

	tokens, err := root.Tokens(ctx, "reader")
	if err != nil {
		t.Fatal(err)
	}
	if err := root.TokenRevoke(ctx, tokens[0].GetId()); err != nil {
		t.Fatal(err)
	}
	if _, err := root.KV().Put(ctx, "a/after", []byte("put after the revocation")); err != nil {
		t.Fatal(err)
	}
	// Read each connection's busy watch first: what it reads gives the
	// opening watch's first answer room.
	for i, c := range conns {
		for _, w := range []struct {
			name   string
			stream *connect.ServerStreamForClient[fencev1.WatchResponse]
		}{{"busy", c.busy}, {"opening", c.opening}} {
			if sentAfter(w.stream) {
				t.Errorf("connection %d: the %s watch sent a/after, put after its token was revoked", i, w.name)
				w.stream.Close()
			} else if connect.CodeOf(w.stream.Err()) != connect.CodeUnauthenticated {
				t.Errorf("connection %d: the %s watch ended with %v, want Unauthenticated", i, w.name, w.stream.Err())
			}
		}
	}
}

// sentAfter reads stream until it ends or sends a/after.
func sentAfter(stream *connect.ServerStreamForClient[fencev1.WatchResponse]) bool {
	for stream.Receive() {
		for _, ev := range stream.Msg().GetEvents() {
			if ev.GetKv().GetKey() == "a/after" {
				return true
			}
		}
	}
	return false
}

package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"connectrpc.com/connect"

	fencev1 "github.com/fencelock/fence/api/fence/v1"
	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// A watcher that stops reading while its changes pile up has its call
// ended and its connection closed once a write of its answer waits past
// the write timeout. It used to hold the connection, a goroutine and a
// connection slot for as long as it stayed connected.
func TestClientThatStopsReadingIsDropped(t *testing.T) {
	s := startTestServer(t, func(c *Config) {
		c.WriteTimeout = 300 * time.Millisecond
		c.MaxConnections = 8
	})
	base := s.conns.Open() // the node's own, to itself
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetReadBuffer(4 << 10) // fill up sooner
	}
	msg := []byte(`{"prefix":"big/"}`)
	body := append([]byte{0, 0, 0, 0, 0}, msg...)
	binary.BigEndian.PutUint32(body[1:5], uint32(len(msg)))
	fmt.Fprintf(conn, "POST /fence.v1.KVService/Watch HTTP/1.1\r\nHost: fence\r\nContent-Type: application/connect+json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitFor(t, "the watch to be open", func() bool { return s.conns.Open() == base+1 })

	// Changes the watcher never reads: far more than the sockets buffer.
	tr := &http.Transport{}
	kv := fencev1connect.NewKVServiceClient(&http.Client{Transport: tr}, "http://"+s.Addr())
	value := bytes.Repeat([]byte("x"), 200<<10)
	for i := range 100 {
		if _, err := kv.Put(context.Background(), connect.NewRequest(&fencev1.PutRequest{Key: fmt.Sprintf("big/%d", i), Value: value})); err != nil {
			t.Fatal(err)
		}
	}
	tr.CloseIdleConnections()
	waitFor(t, "the server to close the connection of a client that does not read", func() bool { return s.conns.Open() <= base })
}

// A watch over HTTP/2 (gRPC) that is idle for longer than the write
// timeout stays open: the deadline bounds each write, not the time between
// them. (It was left armed after each write, and over HTTP/2 an armed
// deadline resets the stream when it passes.)
func TestIdleHTTP2WatchOutlivesWriteTimeout(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.WriteTimeout = 200 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := fencev1connect.NewKVServiceClient(h2c(nil), "http://"+s.Addr(), connect.WithGRPC())
	stream := mustOpenWatch(t, ctx, kv, "idle/", "the watch did not start")
	time.Sleep(600 * time.Millisecond)
	if _, err := newAPI(t, s).kv.Put(ctx, connect.NewRequest(&fencev1.PutRequest{Key: "idle/1", Value: []byte("v")})); err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || len(stream.Msg().GetEvents()) != 1 {
		t.Fatalf("the idle watch ended: %v", stream.Err())
	}
}

package server

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// BenchmarkTransportRoundTrip measures one AppendEntries round trip (one
// small entry, answered at once) through hashicorp/raft's NetworkTransport
// on loopback, beside a plain TCP echo of about the same bytes: what the
// transport adds to every replicated commit (docs/performance.md; issue
// 29's accounting found ~0.2 ms a round trip where the echo takes ~0.05).
func BenchmarkTransportRoundTrip(b *testing.B) {
	b.Run("raft", func(b *testing.B) {
		from, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		defer from.Close()
		to, err := raft.NewTCPTransport("127.0.0.1:0", nil, 2, time.Second, io.Discard)
		if err != nil {
			b.Fatal(err)
		}
		defer to.Close()
		done := make(chan struct{})
		defer close(done)
		go func() {
			for {
				select {
				case rpc := <-to.Consumer():
					rpc.Respond(&raft.AppendEntriesResponse{Success: true, Term: 1, LastLog: 1}, nil)
				case <-done:
					return
				}
			}
		}()
		req := &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("n1"), Addr: []byte(from.LocalAddr())},
			Term:      1, Entries: []*raft.Log{{Index: 1, Term: 1, Type: raft.LogCommand, Data: make([]byte, 64)}}, LeaderCommitIndex: 1,
		}
		var resp raft.AppendEntriesResponse
		for b.Loop() {
			if err := from.AppendEntries("n2", to.LocalAddr(), req, &resp); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("tcp", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		msg := make([]byte, 160)
		for b.Loop() {
			if _, err := c.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(c, msg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

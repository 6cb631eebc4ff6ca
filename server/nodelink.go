package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
)

// Node-to-node calls go over the raft port, not the client API
// (docs/design.md, Node-to-node calls and membership). A connection to the
// raft port whose first byte is nodeLinkMagic is a node link: the node
// answers one hello, saying who it is, where it serves the API and how far
// its log goes, and closes. Every other connection is raft's: raft's own
// RPCs start with a type byte below 8. The raft port is as trusted as raft
// (with TLS, both sides present node certificates), so a hello is as
// trustworthy as the log itself; and the leader asks each member at the
// raft address of its membership, so a node can only speak for itself.

// nodeLinkMagic opens a node link: raft never starts a connection with it.
const nodeLinkMagic = 'F'

// firstByteTimeout bounds how long an accepted raft-port connection may
// take to send its first byte.
const firstByteTimeout = 10 * time.Second

// nodeHello is a node's answer on a node link.
type nodeHello struct {
	// ID is the node's raft server id.
	ID string `json:"id"`
	// API is the address the node serves the client API on.
	API string `json:"api"`
	// LastIndex is the index of the last entry in the node's raft log.
	LastIndex uint64 `json:"last_index"`
}

// peerStream is raft's stream layer over TCP, or over mutual TLS when
// config is set. A peer's certificate is verified against the host it is
// dialed at, so with RaftAddressProvider (--raft-dial) the certificates
// must name the dial addresses.
type peerStream struct {
	net.Listener
	advertise net.Addr
	config    *tls.Config // nil: plain TCP
}

func listenPeerStream(listen string, advertise net.Addr, config *tls.Config) (*peerStream, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	if advertise == nil {
		advertise = ln.Addr()
	}
	if a, ok := advertise.(*net.TCPAddr); !ok || a.IP.IsUnspecified() {
		ln.Close()
		return nil, fmt.Errorf("raft address %s is not one peers can dial; set the raft advertise address", advertise)
	}
	if config != nil {
		ln = tls.NewListener(ln, config)
	}
	return &peerStream{Listener: ln, advertise: advertise, config: config}, nil
}

// Addr is the address peers reach this node on.
func (s *peerStream) Addr() net.Addr { return s.advertise }

// Dial opens a connection to a peer, TLS handshake included, within timeout.
func (s *peerStream) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if s.config == nil {
		return (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", string(address))
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: timeout}, Config: s.config}
	return d.DialContext(ctx, "tcp", string(address))
}

var _ raft.StreamLayer = (*peerStream)(nil)

// nodeLinkMux shares the raft port between raft and node links: it
// accepts every connection, answers node links itself and hands the others
// to raft's Accept.
type nodeLinkMux struct {
	raft.StreamLayer
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	hello     atomic.Pointer[func() nodeHello] // nil until the node can answer
}

func newNodeLinkMux(inner raft.StreamLayer) *nodeLinkMux {
	m := &nodeLinkMux{StreamLayer: inner, conns: make(chan net.Conn), done: make(chan struct{})}
	go m.acceptLoop()
	return m
}

// answerWith makes the mux answer hellos with what hello returns.
func (m *nodeLinkMux) answerWith(hello func() nodeHello) { m.hello.Store(&hello) }

// Accept returns the next connection for raft.
func (m *nodeLinkMux) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting.
func (m *nodeLinkMux) Close() error {
	m.closeOnce.Do(func() { close(m.done) })
	return m.StreamLayer.Close()
}

func (m *nodeLinkMux) acceptLoop() {
	for {
		c, err := m.StreamLayer.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				m.closeOnce.Do(func() { close(m.done) })
				return
			}
			time.Sleep(5 * time.Millisecond) // a transient failure (out of files)
			continue
		}
		go m.route(c)
	}
}

// route reads a connection's first byte and serves it as a node link or
// passes it, the byte included, to raft.
func (m *nodeLinkMux) route(c net.Conn) {
	var first [1]byte
	c.SetReadDeadline(time.Now().Add(firstByteTimeout))
	if _, err := c.Read(first[:]); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	if first[0] == nodeLinkMagic {
		m.answer(c)
		return
	}
	select {
	case m.conns <- &peekedConn{Conn: c, first: first[0]}:
	case <-m.done:
		c.Close()
	}
}

func (m *nodeLinkMux) answer(c net.Conn) {
	defer c.Close()
	hello := m.hello.Load()
	if hello == nil {
		return
	}
	c.SetWriteDeadline(time.Now().Add(firstByteTimeout))
	json.NewEncoder(c).Encode((*hello)())
}

// askHello dials a node's raft address and reads its hello, within timeout.
func (m *nodeLinkMux) askHello(addr raft.ServerAddress, timeout time.Duration) (nodeHello, error) {
	var h nodeHello
	c, err := m.Dial(addr, timeout)
	if err != nil {
		return h, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{nodeLinkMagic}); err != nil {
		return h, err
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		return h, fmt.Errorf("no answer from a fence node: %w", err)
	}
	if err := json.Unmarshal(line, &h); err != nil || h.ID == "" {
		return h, fmt.Errorf("the answer is not a fence node's hello")
	}
	return h, nil
}

// peekedConn is a connection whose first byte was read already.
type peekedConn struct {
	net.Conn
	first byte
	read  bool
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if c.read || len(p) == 0 {
		return c.Conn.Read(p)
	}
	c.read = true
	p[0] = c.first
	return 1, nil
}

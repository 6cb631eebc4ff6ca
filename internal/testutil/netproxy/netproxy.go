// Package netproxy is a TCP proxy for fault injection on loopback: a link
// that can be cut (every connection dropped, new ones refused) and healed,
// or frozen (connections stay open, and nothing more passes), as a peer
// stopped with SIGSTOP looks from outside.
// The checker and the cluster tests put one on each raft link.
//
// It is test scaffolding (internal/testutil/), and the one production code
// that imports it is the fence tool's checker: the client's and the
// server's tests use it too, so it cannot live under cmd/fence/internal/.
package netproxy

import (
	"io"
	"net"
	"sync"
	"time"
)

// Link forwards connections from its own address to a target address.
type Link struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	cut    bool
	delay  time.Duration // each read is held this long before it is passed on
	frozen chan struct{} // closed while the link is not frozen
	conns  map[net.Conn]struct{}
}

// Listen starts a link on a free loopback port that forwards to target.
func Listen(target string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	thawed := make(chan struct{})
	close(thawed)
	l := &Link{ln: ln, target: target, frozen: thawed, conns: map[net.Conn]struct{}{}}
	go l.serve()
	return l, nil
}

// Addr returns the address to dial instead of the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

func (l *Link) serve() {
	for {
		in, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.forward(in)
	}
}

func (l *Link) forward(in net.Conn) {
	l.mu.Lock()
	cut := l.cut
	l.mu.Unlock()
	if cut {
		in.Close()
		return
	}
	out, err := net.Dial("tcp", l.target)
	if err != nil {
		in.Close()
		return
	}
	l.mu.Lock()
	if l.cut { // cut while dialling
		l.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	l.conns[in], l.conns[out] = struct{}{}, struct{}{}
	l.mu.Unlock()
	done := func() {
		in.Close()
		out.Close()
		l.mu.Lock()
		delete(l.conns, in)
		delete(l.conns, out)
		l.mu.Unlock()
	}
	go func() { l.copy(out, in); done() }()
	go func() { l.copy(in, out); done() }()
}

// copy passes bytes from src to dst, holding them while the link is frozen.
func (l *Link) copy(dst io.Writer, src io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		l.mu.Lock()
		gate, delay := l.frozen, l.delay
		l.mu.Unlock()
		time.Sleep(delay)
		<-gate
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// SetFrozen freezes the link (its connections stay open, and no byte
// passes either way, nor is a new connection answered) or thaws it.
func (l *Link) SetFrozen(frozen bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.frozen: // thawed now
		if frozen {
			l.frozen = make(chan struct{})
		}
	default:
		if !frozen {
			close(l.frozen)
		}
	}
}

// SetDelay holds every read on the link for d before passing it on, both
// ways: a slow network (0: none).
func (l *Link) SetDelay(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.delay = d
}

// SetCut cuts the link (dropping every connection) or heals it.
func (l *Link) SetCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if cut {
		for c := range l.conns {
			c.Close()
		}
		l.conns = map[net.Conn]struct{}{}
	}
}

// Close stops the link and drops its connections.
func (l *Link) Close() error {
	l.SetCut(true)
	return l.ln.Close()
}

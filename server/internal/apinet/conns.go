package apinet

import (
	"math"
	"net"
	"sync"
)

// fdReserve is how many of the process's file descriptors the API leaves
// free for everything else a node opens: raft's listener, its pooled
// connections to each peer and the peers' connections to it, the raft log,
// stable store and token reserve, snapshots being written, read or sent,
// and the forwarder's and peer API clients' connections to other nodes.
const fdReserve = 256

// ConnLimit returns how many API connections a node keeps open at once:
// configured (0 for no bound of its own), lowered to leave fdReserve of
// nofile, the open-file limit, free. With fewer than twice fdReserve files
// the API gets half of them. 0 means no limit: none configured, and the
// file limit unknown or unlimited.
func ConnLimit(configured int, nofile uint64, known bool) int {
	if !known || nofile >= math.MaxInt32 {
		return configured
	}
	byFiles := int(nofile) / 2
	if nofile > 2*fdReserve {
		byFiles = int(nofile) - fdReserve
	}
	if configured > 0 && configured < byFiles {
		return configured
	}
	return byFiles
}

// LimitListener accepts at most cap(slots) connections open at once. At
// the limit Accept waits, without polling, until one of them closes;
// meanwhile the kernel queues new connections, up to the listen backlog,
// without giving this process a descriptor for them.
type LimitListener struct {
	net.Listener
	slots     chan struct{} // one element per open connection
	closed    chan struct{}
	closeOnce sync.Once
}

// NewLimitListener bounds ln to limit connections open at once.
func NewLimitListener(ln net.Listener, limit int) *LimitListener {
	return &LimitListener{Listener: ln, slots: make(chan struct{}, limit), closed: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *LimitListener) Accept() (net.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	case <-l.closed:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	return &limitedConn{Conn: c, free: func() { <-l.slots }}, nil
}

// Close stops listening and ends an Accept waiting for a slot.
func (l *LimitListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Open returns how many accepted connections are open.
func (l *LimitListener) Open() int { return len(l.slots) }

// Limit returns how many connections may be open at once.
func (l *LimitListener) Limit() int { return cap(l.slots) }

// limitedConn frees its slot when closed, once.
type limitedConn struct {
	net.Conn
	freeOnce sync.Once
	free     func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.freeOnce.Do(c.free)
	return err
}

// CloseWrite half-closes a TCP connection, as net/http does to let a
// client read an answer sent before the whole request was read.
func (c *limitedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

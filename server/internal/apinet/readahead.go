package apinet

import (
	"net"
	"sync"
)

// readAheadSize is the block a connection reads at once: an HTTP/2
// frame's largest default payload and its header.
const readAheadSize = 16<<10 + 9

// readAheadPool holds the blocks of connections with nothing unread.
var readAheadPool = sync.Pool{New: func() any {
	b := make([]byte, readAheadSize)
	return &b
}}

// ReadAheadListener reads each connection it accepts in blocks (see
// readAheadConn).
type ReadAheadListener struct{ net.Listener }

// Accept accepts the next connection, read in blocks.
func (l ReadAheadListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &readAheadConn{Conn: c}, nil
}

// readAheadConn reads its connection in blocks. HTTP/2's framer reads a
// frame's 9-byte header and then its payload, two reads of the bare
// connection and so two system calls, though the client wrote the frame,
// and often the frames after it, at once; the session stream carries
// each operation in a frame of its own. A block is borrowed from a pool
// only while it holds bytes not yet read, so an idle connection holds
// none. Reads are not concurrent (net/http reads a connection from one
// goroutine at a time).
type readAheadConn struct {
	net.Conn
	buf  *[]byte // nil while nothing read ahead is left
	r, w int
}

func (c *readAheadConn) Read(p []byte) (int, error) {
	if c.buf == nil {
		if len(p) >= readAheadSize {
			return c.Conn.Read(p)
		}
		buf := readAheadPool.Get().(*[]byte)
		n, err := c.Conn.Read(*buf)
		if n == 0 {
			readAheadPool.Put(buf)
			return 0, err
		}
		// An error with data is met again by the next read, as a
		// closed connection or a passed deadline is.
		c.buf, c.r, c.w = buf, 0, n
	}
	n := copy(p, (*c.buf)[c.r:c.w])
	c.r += n
	if c.r == c.w {
		readAheadPool.Put(c.buf)
		c.buf = nil
	}
	return n, nil
}

package apinet

import (
	"net/http"
	"time"
)

// BoundWrites ends a call whose client stops reading its answer: each
// write of the answer (and the server's own last flush, once the handler
// returns) must complete within d, or it fails, the call ends and the
// connection is closed. Waits and watches may still answer for as long as
// they like: only a write that a client leaves blocked is bounded. Without
// it, a watcher that stopped reading held its connection, a goroutine and
// a connection slot (--max-connections) for as long as it stayed connected.
func BoundWrites(next http.Handler, d time.Duration) http.Handler {
	if d <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bw := &boundedWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
		next.ServeHTTP(bw, r)
		bw.arm() // what the server writes after the handler: trailers, the last flush
	})
}

// boundedWriter arms the connection's write deadline before every write,
// and clears it once the write is flushed: over HTTP/2 a deadline is a
// timer on the stream that resets it when it fires, written or not, so a
// deadline left armed ended a watch or a session stream that was merely
// idle for d after its last message. A Write leaves its deadline armed for
// the Flush that follows it (connect flushes after every message), so that
// a message costs two deadline changes, not four: over HTTP/2 each one is
// a message to the connection's serving goroutine, and arming a cleared
// deadline starts a new timer.
type boundedWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	d     time.Duration
	armed bool // by a Write not yet flushed
}

func (b *boundedWriter) arm() { _ = b.rc.SetWriteDeadline(time.Now().Add(b.d)) }

func (b *boundedWriter) disarm() { _ = b.rc.SetWriteDeadline(time.Time{}) }

func (b *boundedWriter) WriteHeader(code int) {
	b.arm()
	b.ResponseWriter.WriteHeader(code)
	if !b.armed {
		b.disarm()
	}
}

func (b *boundedWriter) Write(p []byte) (int, error) {
	b.arm()
	b.armed = true
	return b.ResponseWriter.Write(p)
}

func (b *boundedWriter) Flush() { _ = b.FlushError() }

func (b *boundedWriter) FlushError() error {
	if !b.armed {
		b.arm()
	}
	b.armed = false
	defer b.disarm()
	return b.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's own writer.
func (b *boundedWriter) Unwrap() http.ResponseWriter { return b.ResponseWriter }

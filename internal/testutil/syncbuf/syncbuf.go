// Package syncbuf is a bytes.Buffer safe for concurrent use: a server's
// log or a child process's output that a test reads while it is written.
// It is test scaffolding (internal/testutil/).
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer whose Write and String may be called from any
// goroutine. The zero value is an empty buffer ready to use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

package apinet

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
)

// countingConn counts the reads of the connection under a readAheadConn.
type countingConn struct {
	net.Conn
	reads int
}

func (c *countingConn) Read(p []byte) (int, error) {
	c.reads++
	return c.Conn.Read(p)
}

// A readAheadConn hands on every byte in order, whatever the sizes of the
// reads, reads the connection once for frames written at once, lets a
// large read go straight to the connection, and reports the connection's
// end after the bytes before it.
func TestReadAheadConn(t *testing.T) {
	client, server := net.Pipe()
	counted := &countingConn{Conn: server}
	c := &readAheadConn{Conn: counted}

	// Ten small frames of header and payload, written at once.
	var sent []byte
	for i := range 10 {
		sent = append(sent, bytes.Repeat([]byte{byte(i)}, 9)...)
		sent = append(sent, bytes.Repeat([]byte{byte(100 + i)}, 40)...)
	}
	big := bytes.Repeat([]byte{7}, readAheadSize+100)
	go func() {
		client.Write(sent)
		client.Write(big)
		client.Close()
	}()
	var got []byte
	for range 10 {
		hdr, payload := make([]byte, 9), make([]byte, 40)
		if _, err := io.ReadFull(c, hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, payload); err != nil {
			t.Fatal(err)
		}
		got = append(append(got, hdr...), payload...)
	}
	if !bytes.Equal(got, sent) {
		t.Fatal("the frames came out changed")
	}
	if counted.reads != 1 {
		t.Errorf("%d reads of the connection for frames written at once, want 1", counted.reads)
	}
	if c.buf != nil {
		t.Error("a block is held with nothing left in it")
	}
	p := make([]byte, len(big))
	if _, err := io.ReadFull(c, p); err != nil || !bytes.Equal(p, big) {
		t.Fatalf("a large read: %v", err)
	}
	if n, err := c.Read(make([]byte, 10)); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("after the end: %d, %v; want 0, EOF", n, err)
	}
}

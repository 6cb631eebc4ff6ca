package netproxy

import (
	"io"
	"net"
	"testing"
	"time"
)

// A delayed link holds each read for the delay, both ways: an echo through
// it takes at least twice the delay; and a cut link answers nothing.
func TestDelayAndCut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	l, err := Listen(ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const delay = 50 * time.Millisecond
	l.SetDelay(delay)
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil || buf[0] != 'x' {
		t.Fatalf("echo through the link: %q, %v", buf, err)
	}
	if took := time.Since(start); took < 2*delay {
		t.Fatalf("an echo through a link delayed %v took %v", delay, took)
	}
	l.SetCut(true)
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(buf); err == nil {
		t.Fatal("a cut link kept its connection")
	}
}

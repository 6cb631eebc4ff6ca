package apinet

import (
	"errors"
	"math"
	"net"
	"testing"
	"time"
)

func TestConnLimit(t *testing.T) {
	for _, tc := range []struct {
		configured int
		nofile     uint64
		known      bool
		want       int
	}{
		{10_000, 1 << 20, true, 10_000},        // the configured bound is lower
		{10_000, 4096, true, 4096 - fdReserve}, // the file limit is lower
		{0, 4096, true, 4096 - fdReserve},      // no bound of its own
		{10_000, 300, true, 150},               // few files: half to the API
		{10_000, 0, false, 10_000},             // no file limit known
		{0, 0, false, 0},                       // no limit at all
		{0, math.MaxUint64, true, 0},           // RLIM_INFINITY
	} {
		if got := ConnLimit(tc.configured, tc.nofile, tc.known); got != tc.want {
			t.Errorf("ConnLimit(%d, %d, %v) = %d, want %d", tc.configured, tc.nofile, tc.known, got, tc.want)
		}
	}
}

// At its limit a LimitListener's Accept waits for a connection to close,
// and Close ends that wait.
func TestLimitListenerWaitsForASlot(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := NewLimitListener(inner, 1)
	defer ln.Close()
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	first, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	select {
	case <-accepted:
		t.Fatal("accepted a second connection while the first is open")
	case <-time.After(100 * time.Millisecond):
	}
	first.Close()
	first.Close() // frees its slot once
	second := <-accepted
	if ln.Open() != 1 {
		t.Fatalf("%d connections open, want 1", ln.Open())
	}
	defer second.Close()

	waiting := make(chan error)
	go func() {
		_, err := ln.Accept() // waits for second to close
		waiting <- err
	}()
	time.Sleep(50 * time.Millisecond)
	ln.Close()
	select {
	case err := <-waiting:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end an Accept waiting for a slot")
	}
}

package client

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

// blackholeAddr returns a loopback address where connections are never
// made: a listener whose accept queue (of one) is full, so the kernel drops
// the SYNs of further connections, as a firewall or a host that is gone
// does.
func blackholeAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	filler, err := net.Dial("tcp", addr) // fills the queue
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { filler.Close() })
	if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("this kernel accepts connections beyond a full accept queue")
	}
	return addr
}

// A connection that is never made (the address drops SYNs) counts as no
// node reached, as a refused one does: the first call fails after the dial
// timeout with ErrUnreachable, not after the retry budget. The attempt's
// deadline used to hide the dial behind "did not answer", which counted as
// a node reached.
func TestFirstCallToABlackholeFailsFast(t *testing.T) {
	addr := blackholeAddr(t)
	err := firstNewSession(t, 3*time.Second, "against an address that drops connections", addr)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("NewSession against an address that drops connections: %v, want ErrUnreachable", err)
	}
}

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal: its controlling side and the terminal.
func openPTY(t *testing.T) (control, term *os.File) {
	t.Helper()
	control, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { control.Close() })
	if err := unix.IoctlSetPointerInt(int(control.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(control.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	term, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { term.Close() })
	return control, term
}

// A command run by fence lock from a terminal may read it, as psql or a
// deploy script's prompt does. In a process group of its own it was a
// background job there, and the first read stopped it (SIGTTIN) for good.
func TestLockCommandReadsTheTerminal(t *testing.T) {
	srv := startServer(t)
	control, term := openPTY(t)
	cmd := exec.Command(fenceBin, append(srv.endpoints(), "lock", "e2e/tty", "--", "sh", "-c", `read line; echo "got $line"`)...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = term, term, term
	// fence lock leads a session whose controlling terminal is term, in
	// the foreground, as a login shell's job is.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	shown := func() string {
		mu.Lock()
		defer mu.Unlock()
		return out.String()
	}
	read := make(chan struct{})
	go func() {
		defer close(read)
		buf := make([]byte, 4096)
		for !strings.Contains(shown(), "got hello") {
			n, err := control.Read(buf)
			if err != nil {
				return
			}
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
		}
	}()
	// Answer the command's read once it runs (the lock granted).
	c := newClient(t, srv.addr)
	waitFor(t, 20*time.Second, "the command to hold the lock", func() bool {
		l := lockInfo(t, c, "e2e/tty")
		return l != nil && len(l.GetHolders()) == 1
	})
	if _, err := control.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-read:
	case <-time.After(20 * time.Second):
		t.Fatalf("the command did not read the terminal within 20s (stopped in the background?); the terminal shows:\n%s", shown())
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("fence lock: %v; the terminal shows:\n%s", err, shown())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("fence lock did not exit within 20s of its command")
	}
}

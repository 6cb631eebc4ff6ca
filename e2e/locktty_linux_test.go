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
// And once it is done the terminal is the shell's again: a script's next
// command may read it too.
func TestLockCommandReadsTheTerminal(t *testing.T) {
	srv := startServer(t)
	control, term := openPTY(t)
	script := fmt.Sprintf(`%s --endpoints %s lock e2e/tty -- sh -c 'read line; echo "got $line"'; read after; echo "then $after"`, fenceBin, srv.addr)
	cmd := exec.Command("sh", "-c", script)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = term, term, term
	// The shell leads a session whose controlling terminal is term, in the
	// foreground, as a script run from a login shell does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
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
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := control.Read(buf)
			if err != nil {
				return
			}
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
		}
	}()
	c := newClient(t, srv.addr)
	waitFor(t, 20*time.Second, "the command to hold the lock", func() bool {
		l := lockInfo(t, c, "e2e/tty")
		return l != nil && len(l.GetHolders()) == 1
	})
	for _, step := range []struct{ say, want string }{{"hello", "got hello"}, {"again", "then again"}} {
		if _, err := control.Write([]byte(step.say + "\n")); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(shown(), step.want) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q on the terminal within 20s (a read stopped in the background?); it shows:\n%s", step.want, shown())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("the script: %v; the terminal shows:\n%s", waitErr, shown())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the script did not exit within 20s")
	}
}

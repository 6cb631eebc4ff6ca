package proc_test

import (
	"os/exec"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/proc"
)

// Ended tells a running process from one that exited, before and after it
// is waited for, and leaves its status to Wait.
func TestEndedDoesNotReap(t *testing.T) {
	cmd := exec.Command("sh", "-c", "read line; exit 3")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if proc.Ended(cmd) {
		t.Fatal("Ended before Start")
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if proc.Ended(cmd) {
		t.Fatal("Ended while the process waits for its input")
	}
	in.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !proc.Ended(cmd) {
		if time.Now().After(deadline) {
			t.Fatal("the process exited and Ended did not say so")
		}
		time.Sleep(5 * time.Millisecond)
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("Wait after Ended: %v, want exit status 3", err)
	}
	if !proc.Ended(cmd) {
		t.Fatal("not Ended once reaped")
	}
}

package k8sleader_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencetest"
	"github.com/fencelock/fence/integrations/k8sleader"
	"github.com/fencelock/fence/internal/proc"
)

// childEnv, when set, makes the test binary a child elector instead of
// running the tests: its value is the fence node's endpoint.
const childEnv = "K8SLEADER_TEST_CHILD_ENDPOINT"

func TestMain(m *testing.M) {
	if endpoint := os.Getenv(childEnv); endpoint != "" {
		os.Exit(runChild(endpoint))
	}
	os.Exit(m.Run())
}

// runChild is elector "a" of the election "ctrl", in a process of its own
// so that the test can pause it with SIGSTOP. It reports on standard
// output: "leading TOKEN" when it leads; "wrote" after its first write of
// the key "work" fenced by its term's token; "stale TOKEN HIGHEST" when
// fence refuses such a write, after which it writes no more; "stopped
// leading" when client-go's Run returns. Its controller is careless on
// purpose: it writes every 50 ms without looking at any context, as a
// write already on its way when the pause came would, so that only the
// token stands between it and the resource.
func runChild(endpoint string) int {
	c, err := client.New(client.WithEndpoints(endpoint))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	lock, err := k8sleader.New(c, "ctrl", "a")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: fast.lease, RenewDeadline: fast.renew, RetryPeriod: fast.retry,
		ReleaseOnCancel: true, Name: "ctrl",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { go carelessController(c, lock.Token()) },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	le.Run(context.Background())
	fmt.Println("stopped leading")
	return 0
}

// carelessController writes "work" with token until fence refuses it.
func carelessController(c *client.Client, token uint64) {
	fmt.Println("leading", token)
	wrote := false
	for {
		_, err := c.KV().Put(context.Background(), "work", []byte("a"), client.FencedBy("ctrl", token))
		var stale *fence.StaleTokenError
		switch {
		case errors.As(err, &stale):
			fmt.Println("stale", stale.Token, stale.Highest)
			return
		case err != nil:
			fmt.Fprintln(os.Stderr, "write failed:", err) // unavailable after the pause: try again
		case !wrote:
			fmt.Println("wrote")
			wrote = true
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startChild starts the child elector against node.
func startChild(t *testing.T, node *fencetest.Node) *proc.Process {
	t.Helper()
	if err := proc.CanPause(); err != nil {
		t.Skip(err)
	}
	p, err := proc.Start(proc.Spec{
		Name: "elector a", Path: os.Args[0],
		Env:   append(os.Environ(), childEnv+"="+node.Endpoint()),
		Lines: true, StderrBytes: 64 << 10, DieWithParent: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Kill()
		for range p.Lines() { // drain, so that it is reaped
		}
	})
	return p
}

// waitLine waits for the child's next line that starts with prefix, and
// returns it.
func waitLine(t *testing.T, p *proc.Process, prefix string, within time.Duration) string {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-p.Lines():
			if !ok {
				t.Fatalf("%s exited (status %d) before printing %q; its stderr:\n%s", p.Name(), p.ExitCode(), prefix, proc.LastLines(p.Stderr(), 40))
			}
			if strings.HasPrefix(l.Text, prefix) {
				return l.Text
			}
			t.Logf("%s: %s", p.Name(), l.Text)
		case <-deadline:
			t.Fatalf("%s did not print %q within %v; its stderr:\n%s", p.Name(), prefix, within, proc.LastLines(p.Stderr(), 40))
		}
	}
}

// The story client-go's docs warn of, with client-go's own LeaderElector:
// a leads in a process of its own, b waits; a is stopped with SIGSTOP (a
// GC pause, a VM migration), b takes over once a's fence lease expired,
// with a higher token, and writes; a resumes and its controller writes
// with its old token, which fence refuses; a's elector then finds its
// lease lost and stops leading, leaving b's record alone.
func TestPausedLeaderIsFenced(t *testing.T) {
	node := fencetest.Start(t)
	a := startChild(t, node)
	var tokenA uint64
	if _, err := fmt.Sscanf(waitLine(t, a, "leading ", 30*time.Second), "leading %d", &tokenA); err != nil {
		t.Fatal(err)
	}
	waitLine(t, a, "wrote", 10*time.Second)

	b := startElector(t, node, "ctrl", "b", fast)
	b.waitLeader(t, "a", 10*time.Second)
	if b.lock.Token() != 0 {
		t.Fatalf("b holds token %d while a leads", b.lock.Token())
	}

	if err := a.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	tokenB := b.waitStarted(t, 30*time.Second)
	t.Logf("b leads %v after a was paused (lease duration %v): token %d, a's %d", time.Since(paused).Round(time.Millisecond), fast.lease, tokenB, tokenA)
	if tokenB <= tokenA {
		t.Fatalf("b's token %d, want more than a's %d", tokenB, tokenA)
	}
	if _, err := node.Client().KV().Put(context.Background(), "work", []byte("b"), client.FencedBy(b.lock.Name(), tokenB)); err != nil {
		t.Fatalf("b's write: %v", err)
	}
	if err := a.Resume(); err != nil {
		t.Fatal(err)
	}

	var token, highest uint64
	if _, err := fmt.Sscanf(waitLine(t, a, "stale ", 20*time.Second), "stale %d %d", &token, &highest); err != nil {
		t.Fatal(err)
	}
	if token != tokenA || highest != tokenB {
		t.Fatalf("a's late write was refused as token %d < %d, want %d < %d", token, highest, tokenA, tokenB)
	}
	waitLine(t, a, "stopped leading", 20*time.Second)
	if err := a.Wait(context.Background(), 10*time.Second); err != nil || a.ExitCode() != 0 {
		t.Fatalf("a: %v, exit status %d; its stderr:\n%s", err, a.ExitCode(), proc.LastLines(a.Stderr(), 40))
	}

	kv, err := node.Client().KV().Get(context.Background(), "work")
	if err != nil || string(kv.GetValue()) != "b" || kv.GetToken() != tokenB {
		t.Fatalf("work is %q with token %d (%v), want b's write with %d", kv.GetValue(), kv.GetToken(), err, tokenB)
	}
	if rec := readRecord(t, node.Client(), "ctrl"); rec.HolderIdentity != "b" || rec.LeaderTransitions != 1 {
		t.Fatalf("the record after a stopped: holder %q, %d transitions; want b, 1", rec.HolderIdentity, rec.LeaderTransitions)
	}
	if b.lock.Context().Err() != nil || b.lock.Token() != tokenB {
		t.Fatalf("b's term: %v, token %d; want it running with %d", context.Cause(b.lock.Context()), b.lock.Token(), tokenB)
	}
}

// With ReleaseOnCancel, a leader that stops hands over at once: its
// term's context ends, its fence lease is released, and the next
// candidate leads within a few retry periods, not after the lease
// duration (30 s here) that an expiry would take.
func TestReleaseOnCancelHandsOverAtOnce(t *testing.T) {
	slow := timing{lease: 30 * time.Second, renew: 20 * time.Second, retry: 200 * time.Millisecond}
	node := fencetest.Start(t)
	b := startElector(t, node, "ctrl", "b", slow)
	tokenB := b.waitStarted(t, 20*time.Second)
	term, stop := b.lock.WithTerm(context.Background())
	defer stop()
	c := startElector(t, node, "ctrl", "c", slow)
	c.waitLeader(t, "b", 10*time.Second)

	b.cancel()
	stopped := time.Now()
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		t.Fatal("b's Run did not return within 10s of its cancel")
	}
	if !errors.Is(context.Cause(term), k8sleader.ErrNotLeading) || b.lock.Token() != 0 {
		t.Fatalf("b after its release: term %v, token %d; want ended with ErrNotLeading, 0", context.Cause(term), b.lock.Token())
	}
	tokenC := c.waitStarted(t, slow.lease/3)
	t.Logf("c leads %v after b was cancelled (lease duration %v)", time.Since(stopped).Round(time.Millisecond), slow.lease)
	if tokenC <= tokenB {
		t.Fatalf("c's token %d, want more than b's %d", tokenC, tokenB)
	}
}

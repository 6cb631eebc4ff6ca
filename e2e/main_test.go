package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/proc"
	"github.com/fencelock/fence/internal/testutil/testbin"
)

// fenceBin is the fence binary built by TestMain.
var fenceBin string

const (
	// pollInterval is how often waitFor re-checks a condition.
	pollInterval = 10 * time.Millisecond
	// startTimeout bounds how long a node may take to elect itself.
	startTimeout = 20 * time.Second
)

func TestMain(m *testing.M) { os.Exit(testbin.RunWithFence(m, &fenceBin)) }

// waitFor polls cond every pollInterval until it holds, and fails the test
// if it does not within timeout. It must run on the test's goroutine.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(pollInterval)
	}
}

// freeAddrs returns n distinct loopback addresses whose ports were free a
// moment ago. The probe listeners stay open until all n are chosen, so the
// kernel cannot hand out one port twice.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

// process is a fence process started by a test, with all its output
// kept. It runs in its own process group, so that cleanup also reaches the
// commands `fence lock` started.
type process struct {
	*proc.Process
	stdout proc.Tail
}

// startFence starts the fence binary with args. At cleanup the process group
// gets SIGCONT (in case it was stopped) and SIGKILL, and the test fails if the
// process reported a data race.
func startFence(t *testing.T, name string, args ...string) *process {
	t.Helper()
	p := newProc(t, name, args...)
	t.Cleanup(func() { p.cleanup(t) })
	return p
}

// newProc starts the fence binary with args; the caller arranges cleanup.
func newProc(t *testing.T, name string, args ...string) *process {
	t.Helper()
	return startProcess(t, name, fenceBin, args...)
}

// startProcess starts the program at path with args; the caller arranges
// cleanup.
func startProcess(t *testing.T, name, path string, args ...string) *process {
	t.Helper()
	p := &process{}
	var err error
	p.Process, err = proc.Start(proc.Spec{Name: name, Path: path, Args: args, Stdout: &p.stdout})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// cleanup kills what is left of p's process group, waits for p, and fails
// the test if p reported a data race.
func (p *process) cleanup(t *testing.T) {
	_ = p.Kill()
	if err := p.Wait(context.Background(), 10*time.Second); err != nil {
		t.Errorf("after SIGKILL: %v", err)
	}
	if stderr := p.Stderr(); strings.Contains(stderr, "WARNING: DATA RACE") {
		t.Errorf("%s (pid %d) reported a data race:\n%s", p.Name(), p.Pid(), stderr)
	} else if t.Failed() {
		t.Logf("%s (pid %d) stderr (tail):\n%s", p.Name(), p.Pid(), tail(stderr, 3000))
	}
}

// signal sends sig to the process itself, not its group.
func (p *process) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// waitExit waits for the process to exit and returns its exit code (-1 if a
// signal ended it).
func (p *process) waitExit(t *testing.T, timeout time.Duration) int {
	t.Helper()
	if err := p.Wait(context.Background(), timeout); err != nil {
		t.Fatalf("%v; stderr:\n%s", err, tail(p.Stderr(), 3000))
	}
	return p.ExitCode()
}

// failIfExited fails the test at once if p has exited, showing why.
func (p *process) failIfExited(t *testing.T) {
	t.Helper()
	if p.Exited() {
		t.Fatalf("%s (pid %d) exited early with status %d; stderr:\n%s", p.Name(), p.Pid(), p.ExitCode(), tail(p.Stderr(), 3000))
	}
}

// waitAllExitZero waits for each of procs to exit, and fails the test for
// each that exited other than 0.
func waitAllExitZero(t *testing.T, procs []*process, timeout time.Duration) {
	t.Helper()
	for _, p := range procs {
		if code := p.waitExit(t, timeout); code != 0 {
			t.Errorf("%s exited %d, want 0; stderr:\n%s", p.Name(), code, p.Stderr())
		}
	}
}

// readLog returns the lines of the file log in dir, which the commands of
// a test append to, and the whole file for messages.
func readLog(t *testing.T, dir string) (lines []string, data []byte) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatalf("reading the log of the commands: %v", err)
	}
	return strings.Split(strings.TrimSpace(string(data)), "\n"), data
}

// runFence runs a fence client command to completion.
func runFence(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	p := startFence(t, "fence "+args[0], args...)
	code = p.waitExit(t, 30*time.Second)
	return p.stdout.String(), p.Stderr(), code
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// server is a single-node `fence serve` on loopback ports with its own data
// directory. It can be killed and restarted on the same data and ports.
type server struct {
	dataDir  string
	addr     string // API, host:port
	raftAddr string
	extra    []string
	proc     *process   // the running (or last) process
	procs    []*process // every process run for this node, for cleanup
	// web, when set, is the HTTPS client that reaches a node serving TLS.
	web *http.Client
}

// startServer starts a node and waits until it is the leader and serves
// linearizable reads. extra flags go to `fence serve`.
func startServer(t *testing.T, extra ...string) *server {
	t.Helper()
	return startServerWith(t, nil, extra...)
}

// startServerWith is startServer for a node serving TLS, reached with web.
func startServerWith(t *testing.T, web *http.Client, extra ...string) *server {
	t.Helper()
	s := &server{dataDir: t.TempDir(), extra: extra, web: web}
	// One cleanup for every incarnation, registered before any client or
	// session of the test, so that those are closed while the node still runs.
	t.Cleanup(func() {
		for _, p := range s.procs {
			p.cleanup(t)
		}
	})
	// A port found free can be taken by someone else before the node binds
	// it; then try other ports.
	for attempt := 1; ; attempt++ {
		addrs := freeAddrs(t, 2)
		s.addr, s.raftAddr = addrs[0], addrs[1]
		if s.start(t) || attempt == 3 {
			break
		}
	}
	s.waitReady(t)
	return s
}

// restart starts the node again on the same data and ports, after kill.
func (s *server) restart(t *testing.T) {
	t.Helper()
	// The ports were freed by the kill; an outgoing connection may hold one
	// for a moment, so retry rather than fail.
	waitFor(t, 10*time.Second, "fence serve to bind its ports again", func() bool { return s.start(t) })
	s.waitReady(t)
}

// start runs `fence serve` and reports false if it exited at once because
// a port was taken.
func (s *server) start(t *testing.T) bool {
	t.Helper()
	args := []string{"serve",
		"--data-dir", s.dataDir,
		"--listen", s.addr,
		"--raft-listen", s.raftAddr,
		"--heartbeat-timeout", "100ms",
		"--election-timeout", "100ms",
	}
	s.proc = newProc(t, "fence serve "+s.addr, append(args, s.extra...)...)
	s.procs = append(s.procs, s.proc)
	// `fence serve` logs "fence node started" once both ports are bound.
	waitFor(t, startTimeout, "fence serve on "+s.addr+" to open its ports", func() bool {
		return s.proc.Exited() || serving(s.proc.Stderr(), s.addr)
	})
	if s.proc.Exited() && strings.Contains(s.proc.Stderr(), "address already in use") {
		t.Logf("fence serve could not bind %s or %s; retrying: %s", s.addr, s.raftAddr, strings.TrimSpace(s.proc.Stderr()))
		return false
	}
	return true
}

// serving reports whether a `fence serve`'s log (text format) says it
// started with its API on addr.
func serving(stderr, addr string) bool {
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, `msg="fence node started"`) && strings.Contains(line, " listen="+addr+" ") {
			return true
		}
	}
	return false
}

// waitReady polls /healthz until it answers 200, then ListLocks (a
// linearizable read) until it succeeds, so the node is a ready leader.
func (s *server) waitReady(t *testing.T) {
	t.Helper()
	web, base := httpClient, "http://"+s.addr
	if s.web != nil {
		web, base = s.web, "https://"+s.addr
	}
	ok := func(resp *http.Response, err error) bool {
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	waitFor(t, startTimeout, "fence serve on "+s.addr+" to be healthy", func() bool {
		s.proc.failIfExited(t)
		return ok(web.Get(base + "/healthz"))
	})
	waitFor(t, startTimeout, "fence serve on "+s.addr+" to serve reads", func() bool {
		s.proc.failIfExited(t)
		return ok(web.Post(base+"/fence.v1.LockService/ListLocks", "application/json", strings.NewReader("{}")))
	})
}

// kill sends SIGKILL to the node and waits until it is gone.
func (s *server) kill(t *testing.T) {
	t.Helper()
	s.proc.signal(t, syscall.SIGKILL)
	if code := s.proc.waitExit(t, 10*time.Second); code != -1 {
		t.Fatalf("fence serve exited with status %d, not by SIGKILL", code)
	}
}

// endpoints returns the global flag that points a fence command at s.
func (s *server) endpoints() []string { return []string{"--endpoints", s.addr} }

var httpClient = &http.Client{Timeout: 10 * time.Second}

// post sends a Connect unary call as JSON and returns the HTTP status and body.
//
// Like a curl user, post remembers the secret of every session it creates
// on a node, and adds it ("sessionSecret") to a body that names one of
// them by "sessionId" without a secret.
func post(t *testing.T, addr, procedure, body string) (int, []byte) {
	t.Helper()
	resp, err := httpClient.Post("http://"+addr+"/"+procedure, "application/json", strings.NewReader(withSecret(addr, body)))
	if err != nil {
		return 0, []byte(err.Error())
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading %s response: %v", procedure, err)
	}
	if resp.StatusCode == http.StatusOK && strings.HasSuffix(procedure, "/CreateSession") {
		var created struct {
			SessionID     string `json:"sessionId"`
			SessionSecret string `json:"sessionSecret"`
		}
		if json.Unmarshal(data, &created) == nil {
			sessionSecrets.Store(addr+"/"+created.SessionID, created.SessionSecret)
		}
	}
	return resp.StatusCode, data
}

// sessionSecrets maps "addr/session id" to the session's secret.
var sessionSecrets sync.Map

func withSecret(addr, body string) string {
	var m map[string]json.RawMessage
	if json.Unmarshal([]byte(body), &m) != nil || m["sessionSecret"] != nil {
		return body
	}
	var id string
	if json.Unmarshal(m["sessionId"], &id) != nil {
		return body
	}
	secret, ok := sessionSecrets.Load(addr + "/" + id)
	if !ok {
		return body
	}
	m["sessionSecret"], _ = json.Marshal(secret)
	out, _ := json.Marshal(m)
	return string(out)
}

// mustPost is post for calls that must succeed; it decodes the answer into out.
func mustPost(t *testing.T, addr, procedure, body string, out any) {
	t.Helper()
	status, data := post(t, addr, procedure, body)
	if status != http.StatusOK {
		t.Fatalf("%s %s: HTTP %d: %s", procedure, body, status, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s: decoding %s: %v", procedure, data, err)
		}
	}
}

// newClient returns a Go client for addr, closed at cleanup.
func newClient(t *testing.T, addr string, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.New(append([]client.Option{client.WithEndpoints(addr)}, opts...)...)
	if err != nil {
		t.Fatalf("client.New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newSession opens a session, closed at cleanup (before the node is killed).
func newSession(t *testing.T, c *client.Client, ttl time.Duration, owner string) *client.Session {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.NewSession(ctx, client.WithTTL(ttl), client.WithOwner(owner))
	if err != nil {
		t.Fatalf("creating session %q: %v", owner, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

// lockInfo returns the listing of one lock; a lock nobody holds or waits
// for is not listed and comes back empty.
func lockInfo(t *testing.T, c *client.Client, name string) *client.LockInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	locks, err := c.Locks(ctx, name)
	if err != nil {
		t.Fatalf("listing locks: %v", err)
	}
	for _, l := range locks {
		if l.GetName() == name {
			return l
		}
	}
	return &client.LockInfo{Name: name}
}

// checkNotListed fails the test if the lock name still has holders or
// waiters; when says when the test looks, for the message.
func checkNotListed(t *testing.T, c *client.Client, name, when string) {
	t.Helper()
	if l := lockInfo(t, c, name); len(l.GetHolders())+len(l.GetWaiters()) != 0 {
		t.Errorf("%s, lock %s is still listed: %v", when, name, l)
	}
}

// ownerOf is the owner text `fence lock` gives its session.
func ownerOf(p *process) string { return fmt.Sprintf("fence lock pid %d on ", p.Pid()) }

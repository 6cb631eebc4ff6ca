package clients_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/internal/testutil/testbin"
	"github.com/fencelock/fence/internal/testutil/testtls"
)

// fenceBin is the fence command that TestMain builds; every node the
// scenarios run is a `fence serve` process of it.
var fenceBin string

func TestMain(m *testing.M) { os.Exit(testbin.RunWithFence(m, &fenceBin)) }

// A control serves the scenarios of another language's suite on loopback,
// as JSON over HTTP, so that its faults are the same real signals the Go
// scenarios send:
//
//	POST /groups                {"nodes":3,"tls":true,"auth":true}
//	  -> {"id":"g1","endpoints":[...],"nodes":["fence1",...],"ca_file":"...","token":"..."}
//	GET  /groups/g1/leader      -> {"node":"fence2","endpoint":"127.0.0.1:..."}
//	POST /groups/g1/kill        {"node":"leader"}   (or a node id, or "all")
//	POST /groups/g1/pause       {"node":"all"}      SIGSTOP
//	POST /groups/g1/resume      {"node":"all"}      SIGCONT
//	POST /groups/g1/restart     {"node":"fence2"}   a killed node, on its data dir
//	  -> {"nodes":["fence2"]}
//
// An error is answered 4xx/5xx with {"error":"..."}. Every group stops when
// the test ends.
type control struct {
	t   *testing.T
	url string

	mu     sync.Mutex
	groups map[string]*group
}

func newControl(t *testing.T) *control {
	c := &control{t: t, groups: map[string]*group{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /groups", c.handle(func(r *http.Request, g *group) (any, error) {
		var req groupSpec
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			return nil, err
		}
		g, err := c.start(req)
		if err != nil {
			return nil, err
		}
		return g.describe(), nil
	}))
	mux.HandleFunc("GET /groups/{id}/leader", c.handle(func(r *http.Request, g *group) (any, error) {
		n, err := g.leader(r.Context())
		if err != nil {
			return nil, err
		}
		return map[string]string{"node": n.id, "endpoint": n.api}, nil
	}))
	for verb, act := range map[string]func(*node) error{
		"kill": (*node).kill, "pause": (*node).pause, "resume": (*node).resume, "restart": (*node).start,
	} {
		mux.HandleFunc("POST /groups/{id}/"+verb, c.handle(func(r *http.Request, g *group) (any, error) {
			var req struct{ Node string }
			if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
				return nil, err
			}
			nodes, err := g.pick(r.Context(), req.Node)
			if err != nil {
				return nil, err
			}
			ids := []string{}
			for _, n := range nodes {
				if req.Node == "all" && n.running() == (verb == "restart") {
					continue // "all" is every node the verb applies to
				}
				if err := act(n); err != nil {
					return nil, fmt.Errorf("%s %s: %w", verb, n.id, err)
				}
				ids = append(ids, n.id)
			}
			return map[string][]string{"nodes": ids}, nil
		}))
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	c.url = srv.URL
	return c
}

// handle answers fn's result as JSON, with the group the path names.
func (c *control) handle(fn func(*http.Request, *group) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var g *group
		if id := r.PathValue("id"); id != "" {
			c.mu.Lock()
			g = c.groups[id]
			c.mu.Unlock()
			if g == nil {
				writeJSON(w, http.StatusNotFound, map[string]string{"error": "no group " + id})
				return
			}
		}
		out, err := fn(r, g)
		if err != nil {
			c.t.Logf("control: %s %s: %v", r.Method, r.URL.Path, err)
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, out)
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

type groupSpec struct {
	Nodes int
	TLS   bool
	Auth  bool
}

// A group is a raft group of fence serve processes on loopback.
type group struct {
	id     string
	t      *testing.T
	nodes  []*node
	caFile string
	token  string
	tls    *tls.Config
}

type node struct {
	id, api, raft, dir string
	args               []string
	log                *os.File

	mu  sync.Mutex
	cmd *exec.Cmd
}

func (c *control) start(spec groupSpec) (*group, error) {
	if spec.Nodes == 0 {
		spec.Nodes = 1
	}
	if spec.Nodes < 1 || spec.Nodes > 5 {
		return nil, fmt.Errorf("nodes: %d, want 1 to 5", spec.Nodes)
	}
	c.mu.Lock()
	g := &group{id: fmt.Sprintf("g%d", len(c.groups)+1), t: c.t}
	c.groups[g.id] = g
	c.mu.Unlock()
	return g, g.start(spec)
}

func (g *group) start(spec groupSpec) error {
	t := g.t
	dir := t.TempDir()
	var tlsArgs []string
	if spec.TLS {
		ca := testtls.NewCA(t, "fence-clients-ca")
		f := ca.WriteFiles(t, dir, "localhost")
		g.caFile = f.CA
		g.tls = &tls.Config{RootCAs: ca.Pool()}
		tlsArgs = []string{"--cert-file", f.Cert, "--key-file", f.Key, "--trusted-ca-file", f.CA}
	}
	addrs := freeAddrs(t, 2*spec.Nodes)
	var peers []string
	for i := range spec.Nodes {
		n := &node{id: fmt.Sprintf("fence%d", i+1), api: addrs[2*i], raft: addrs[2*i+1], dir: filepath.Join(dir, fmt.Sprintf("data%d", i+1))}
		g.nodes = append(g.nodes, n)
		peers = append(peers, n.id+"="+n.raft)
	}
	for _, n := range g.nodes {
		n.args = append([]string{"serve", "--node-id", n.id, "--data-dir", n.dir,
			"--listen", n.api, "--raft-listen", n.raft,
			"--heartbeat-timeout", "200ms", "--election-timeout", "200ms"}, tlsArgs...)
		if spec.Nodes > 1 {
			n.args = append(n.args, "--peers", strings.Join(peers, ","))
		}
		log, err := os.Create(filepath.Join(dir, n.id+".log"))
		if err != nil {
			return err
		}
		n.log = log
		if err := n.start(); err != nil {
			return err
		}
		t.Cleanup(func() {
			n.resume()
			n.kill()
			log.Close()
			if t.Failed() {
				out, _ := os.ReadFile(log.Name())
				t.Logf("%s %s's log:\n%s", g.id, n.id, tail(string(out), 40))
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := g.leader(ctx); err != nil {
		return err
	}
	if spec.Auth {
		return g.enableAuth(ctx, dir)
	}
	return nil
}

// enableAuth makes user root with role root, a token for it, and turns
// auth on, with the fence command as an operator would.
func (g *group) enableAuth(ctx context.Context, dir string) error {
	tokenFile := filepath.Join(dir, "root.token")
	steps := [][]string{
		{"user", "add", "root"},
		{"user", "grant-role", "root", "root"},
		{"token", "create", "root", "--out", tokenFile},
		{"--auth-token-file", tokenFile, "auth", "enable"},
	}
	for _, args := range steps {
		if err := g.fence(ctx, args...); err != nil {
			return err
		}
	}
	token, err := os.ReadFile(tokenFile)
	if err != nil {
		return err
	}
	g.token = strings.TrimSpace(string(token))
	return nil
}

// fence runs the fence command against the group.
func (g *group) fence(ctx context.Context, args ...string) error {
	all := []string{"--endpoints", strings.Join(g.endpoints(), ",")}
	if g.caFile != "" {
		all = append(all, "--cacert", g.caFile)
	}
	cmd := exec.CommandContext(ctx, fenceBin, append(all, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("fence %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

func (g *group) endpoints() []string {
	var eps []string
	for _, n := range g.nodes {
		eps = append(eps, n.api)
	}
	return eps
}

func (g *group) describe() map[string]any {
	var ids []string
	for _, n := range g.nodes {
		ids = append(ids, n.id)
	}
	return map[string]any{"id": g.id, "endpoints": g.endpoints(), "nodes": ids, "ca_file": g.caFile, "token": g.token}
}

// client returns a Go client of the group, with its CA and token.
func (g *group) client(opts ...client.Option) *client.Client {
	g.t.Helper()
	base := []client.Option{client.WithEndpoints(g.endpoints()...)}
	if g.tls != nil {
		base = append(base, client.WithTLS(g.tls))
	}
	if g.token != "" {
		base = append(base, client.WithBearerToken(g.token))
	}
	c, err := client.New(append(base, opts...)...)
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { c.Close() })
	return c
}

// leader waits until a running node reports itself leader, and returns it.
func (g *group) leader(ctx context.Context) (*node, error) {
	c := g.client()
	for {
		for _, n := range g.nodes {
			if !n.running() {
				continue
			}
			st, err := c.StatusOf(ctx, n.api)
			if err == nil && st.State == "Leader" && st.LeaderAddress != "" {
				return n, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%s has no leader: %w", g.id, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pick resolves a node name of the control's requests: a node id, "leader"
// or "all".
func (g *group) pick(ctx context.Context, name string) ([]*node, error) {
	switch name {
	case "all":
		return g.nodes, nil
	case "leader":
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		n, err := g.leader(ctx)
		if err != nil {
			return nil, err
		}
		return []*node{n}, nil
	}
	for _, n := range g.nodes {
		if n.id == name {
			return []*node{n}, nil
		}
	}
	return nil, fmt.Errorf("%s has no node %q", g.id, name)
}

func (n *node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("it runs")
	}
	cmd := exec.Command(fenceBin, n.args...)
	cmd.Stdout, cmd.Stderr = n.log, n.log
	if err := cmd.Start(); err != nil {
		return err
	}
	n.cmd = cmd
	return nil
}

func (n *node) running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

func (n *node) signal(sig syscall.Signal) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return fmt.Errorf("it does not run")
	}
	return n.cmd.Process.Signal(sig)
}

func (n *node) pause() error  { return n.signal(syscall.SIGSTOP) }
func (n *node) resume() error { return n.signal(syscall.SIGCONT) }

func (n *node) kill() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return nil
	}
	n.cmd.Process.Kill()
	n.cmd.Wait()
	n.cmd = nil
	return nil
}

func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		addrs[i] = ln.Addr().String()
	}
	return addrs
}

func tail(s string, lines int) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

package server

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/testutil/testtls"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// --listen-metrics serves the metrics and the probes over plain HTTP
// while the API requires client certificates.
func TestMetricsPortBesideClientCertAuth(t *testing.T) {
	ca := testtls.NewCA(t, "fence test CA")
	s := startTestServer(t, func(c *Config) {
		c.ListenMetrics = "127.0.0.1:0"
		c.TLS = nodeTLS(t, ca, "node")
	})
	if s.MetricsAddr() == "" {
		t.Fatal("no metrics address")
	}
	base := "http://" + s.MetricsAddr()
	for path, want := range map[string]string{
		"/metrics": "fence_is_leader 1",
		"/healthz": "ok",
		"/livez":   "ok",
		"/readyz":  "ok",
	} {
		code, body := get(t, base+path)
		if code != http.StatusOK || !strings.Contains(body, want) {
			t.Errorf("GET %s: %d %q, want 200 with %q", path, code, firstLine(body), want)
		}
	}
	// The API port itself still refuses plain HTTP.
	if resp, err := http.Get("http://" + s.Addr() + "/healthz"); err == nil {
		if resp.StatusCode == http.StatusOK {
			t.Error("the API port answered plain HTTP with 200")
		}
		resp.Body.Close()
	}
}

// A node of a group whose other members are not up has no leader: it is
// live but not ready, and says why, on both ports.
func TestReadyzWithoutLeader(t *testing.T) {
	unused := func() string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().String()
	}
	raftAddr := unused()
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.NodeID = "n1"
	cfg.Listen = "127.0.0.1:0"
	cfg.ListenMetrics = "127.0.0.1:0"
	cfg.RaftListen = raftAddr
	cfg.Peers = map[string]string{"n1": raftAddr, "n2": unused(), "n3": unused()}
	cfg.HeartbeatTimeout = 50 * time.Millisecond
	cfg.ElectionTimeout = 50 * time.Millisecond
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, base := range []string{"http://" + s.MetricsAddr(), "http://" + s.Addr()} {
		if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no leader") {
			t.Errorf("GET %s/readyz without a leader: %d %q, want 503 saying there is no leader", base, code, body)
		}
		if code, body := get(t, base+"/livez"); code != http.StatusOK {
			t.Errorf("GET %s/livez without a leader: %d %q, want 200: the process is alive", base, code, body)
		}
		if code, _ := get(t, base+"/healthz"); code != http.StatusServiceUnavailable {
			t.Errorf("GET %s/healthz without a leader: %d, want 503", base, code)
		}
	}
}

// /livez fails while the state machine cannot be read, as when its apply
// path is wedged, and passes again once it can.
func TestLivezFailsWhileTheStateMachineIsWedged(t *testing.T) {
	s := startTestServer(t, func(c *Config) { c.ListenMetrics = "127.0.0.1:0" })
	release := make(chan struct{})
	reading := make(chan struct{})
	go s.fsm.Read(func(*fsm.State) { close(reading); <-release })
	<-reading
	// A write now waits for the lock, and new reads wait behind it.
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		newAPI(t, s).session(10 * time.Second)
	}()
	waitFor(t, "the write to wait for the state machine", func() bool {
		ok := make(chan struct{})
		go func() { s.fsm.Read(func(*fsm.State) {}); close(ok) }()
		select {
		case <-ok:
			return false
		case <-time.After(50 * time.Millisecond):
			return true
		}
	})
	code, body := get(t, "http://"+s.MetricsAddr()+"/livez")
	close(release)
	<-wrote
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "not answered") {
		t.Fatalf("GET /livez with the state machine wedged: %d %q, want 503", code, body)
	}
	waitFor(t, "/livez to pass again", func() bool {
		code, _ := get(t, "http://"+s.MetricsAddr()+"/livez")
		return code == http.StatusOK
	})
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

package cli

import (
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencelock/fence/internal/testutil/syncbuf"
)

// runServe starts `fence serve` on free ports with args, waits until it
// leads, stops it with SIGTERM and returns its log.
func runServe(t *testing.T, args ...string) string {
	t.Helper()
	return runServeEnv(t, nil, append([]string{"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--raft-listen", "127.0.0.1:0", "--listen-metrics", "127.0.0.1:0"}, args...)...)
}

// runServeEnv is runServe with the environment env (nil: the test's) and
// args alone.
func runServeEnv(t *testing.T, env []string, args ...string) string {
	t.Helper()
	var stderr syncbuf.Buffer
	cmd := exec.Command(fenceBin, append([]string{"serve"}, args...)...)
	cmd.Env = env
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.After(20 * time.Second)
	for !strings.Contains(stderr.String(), "became leader") {
		select {
		case err := <-exited:
			t.Fatalf("fence serve exited: %v\n%s", err, stderr.String())
		case <-deadline:
			cmd.Process.Kill()
			t.Fatalf("fence serve did not lead within 20s:\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Fatalf("fence serve after SIGTERM: %v\n%s", err, stderr.String())
	}
	return stderr.String()
}

// Every line a node writes is a log record in the format asked for, and a
// normal single-node start and stop logs no warning or error.
func TestServeLogsOnlyRecordsAndNoWarnings(t *testing.T) {
	t.Run("json", func(t *testing.T) {
		log := runServe(t, "--log-format", "json")
		for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
			var rec struct{ Level, Msg string }
			if err := json.Unmarshal([]byte(line), &rec); err != nil || rec.Level == "" || rec.Msg == "" {
				t.Errorf("not a JSON log record: %q", line)
				continue
			}
			if rec.Level != "INFO" && rec.Level != "DEBUG" {
				t.Errorf("%s on a normal start: %s", rec.Level, line)
			}
		}
	})
	t.Run("text", func(t *testing.T) {
		log := runServe(t)
		for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
			if !strings.HasPrefix(line, "time=") || !strings.Contains(line, " level=") {
				t.Errorf("not a text log record: %q", line)
			}
			if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				t.Errorf("warning on a normal start: %s", line)
			}
		}
	})
}

// A group's leader stopped with SIGTERM hands its leadership over and
// says so as info, logging nothing above info; the others log no error,
// and at most one warning each that it is gone. raft used to log every
// failed heartbeat and append to the stopped node as an error, several a
// second, and the hand-off itself as an error.
func TestServeSIGTERMHandOffLogsInfo(t *testing.T) {
	var peers []string
	var held []net.Listener // three distinct free ports
	for i := 1; i <= 3; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, ln)
		peers = append(peers, fmt.Sprintf("n%d=%s", i, ln.Addr()))
	}
	for _, ln := range held {
		ln.Close()
	}
	type node struct {
		cmd    *exec.Cmd
		log    *syncbuf.Buffer
		exited chan error
	}
	var nodes []*node
	for i, p := range peers {
		_, raftAddr, _ := strings.Cut(p, "=")
		n := &node{log: &syncbuf.Buffer{}, exited: make(chan error, 1)}
		n.cmd = exec.Command(fenceBin, "serve", "--node-id", fmt.Sprintf("n%d", i+1), "--data-dir", t.TempDir(),
			"--listen", "127.0.0.1:0", "--raft-listen", raftAddr, "--listen-metrics", "127.0.0.1:0", "--peers", strings.Join(peers, ","))
		n.cmd.Stdout, n.cmd.Stderr = n.log, n.log
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		if err := n.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { n.exited <- n.cmd.Wait() }()
		defer func() {
			n.cmd.Process.Kill()
			<-n.exited
		}()
	}
	var leader *node
	for deadline := time.Now().Add(20 * time.Second); leader == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no node led within 20s:\n%s\n%s\n%s", nodes[0].log, nodes[1].log, nodes[2].log)
		}
		for _, n := range nodes {
			if strings.Contains(n.log.String(), "became leader") {
				leader = n
			}
		}
	}
	time.Sleep(500 * time.Millisecond) // the followers catch up
	leader.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-leader.exited:
		leader.exited <- err
		if err != nil {
			t.Fatalf("the leader after SIGTERM: %v\n%s", err, leader.log)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the leader did not exit within 10s of SIGTERM:\n%s", leader.log)
	}
	time.Sleep(time.Second) // the new leader tries to reach the old one
	if !strings.Contains(leader.log.String(), `level=INFO msg="leadership handed over"`) {
		t.Errorf("the leader did not log the hand-off as info:\n%s", leader.log)
	}
	for _, n := range nodes {
		warnings, handedOver := 0, false
		for _, line := range strings.Split(strings.TrimSpace(n.log.String()), "\n") {
			handedOver = handedOver || strings.Contains(line, `msg="leadership handed over"`)
			switch {
			case n == leader && handedOver && strings.Contains(line, "level=WARN") && strings.Contains(line, "election"):
				// Handed over, the old leader is a follower until it
				// stops; on a loaded machine it may time out waiting for
				// the new leader's first heartbeat, and stand itself.
			case strings.Contains(line, "level=ERROR"), n == leader && strings.Contains(line, "level=WARN"):
				t.Errorf("%s", line)
			case strings.Contains(line, "level=WARN") && strings.Contains(line, `msg="peer unreachable"`):
				warnings++
			case strings.Contains(line, "level=WARN") && (strings.Contains(line, "election") || strings.Contains(line, "vote")):
				// On a loaded machine the hand-off's election can take a
				// second round, which raft warns of: an election that was
				// slow, not a failure.
			case strings.Contains(line, "level=WARN"):
				t.Errorf("%s", line)
			}
		}
		if warnings > 1 {
			t.Errorf("%d warnings that the old leader is gone, want at most 1:\n%s", warnings, n.log)
		}
	}
}

// An unknown --log-format is refused, naming the formats.
func TestServeRefusesUnknownLogFormat(t *testing.T) {
	out, err := exec.Command(fenceBin, "serve", "--log-format", "xml", "--data-dir", t.TempDir()).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "want text or json") {
		t.Fatalf("fence serve --log-format xml: %v\n%s", err, out)
	}
}

// A node that listens beyond loopback warns that it has no TLS and no auth.
func TestServeWarnsWhenUnsecured(t *testing.T) {
	var stderr syncbuf.Buffer
	cmd := exec.Command(fenceBin, "serve", "--data-dir", t.TempDir(), "--listen", "0.0.0.0:0", "--raft-listen", "127.0.0.1:0")
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "with auth off") || !strings.Contains(stderr.String(), "without TLS") {
		if time.Now().After(deadline) {
			t.Fatalf("no warnings of TLS and auth off:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

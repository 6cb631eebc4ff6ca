package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fence/internal/testutil/pgtest"
	"github.com/fencelock/fence/internal/testutil/testbin"
)

var (
	exampleOnce sync.Once
	exampleBin  string
	exampleErr  error
)

// buildExample builds examples/fenced-storage once.
func buildExample(t *testing.T) string {
	t.Helper()
	exampleOnce.Do(func() {
		exampleBin, exampleErr = testbin.Build(filepath.Dir(fenceBin), "fenced-storage", "github.com/fencelock/fence/examples/fenced-storage")
	})
	if exampleErr != nil {
		t.Fatalf("building the example: %v", exampleErr)
	}
	return exampleBin
}

// startExample starts the example binary as a test process.
func startExample(t *testing.T, name string, args ...string) *process {
	t.Helper()
	p := startProcess(t, name, buildExample(t), args...)
	t.Cleanup(func() { p.cleanup(t) })
	return p
}

// The article's timeline with real processes against three resources: A
// takes the lock and is stopped with SIGSTOP past its 1s lease, B takes
// the lock and writes, A is continued and writes with its old token. Each
// resource refuses A's write, and B's value survives.
func TestArticleTimeline(t *testing.T) {
	srv := startServer(t)
	for _, tc := range []struct {
		name   string
		target func(t *testing.T) (target string, read func(key string) string)
	}{
		{"fenced KV", func(t *testing.T) (string, func(string) string) {
			return "kv", func(key string) string {
				out, _, code := runFence(t, "--endpoints", srv.addr, "kv", "get", key)
				if code != 0 {
					return ""
				}
				return strings.TrimSpace(out)
			}
		}},
		{"HTTP guard", func(t *testing.T) (string, func(string) string) {
			addr := freeAddrs(t, 1)[0]
			st := startExample(t, "storage", "storage", "--listen", addr, "--db", filepath.Join(t.TempDir(), "tokens.db"))
			waitFor(t, 10*time.Second, "the storage to listen", func() bool {
				st.failIfExited(t)
				return strings.Contains(st.stdout.String(), "serving on")
			})
			return "http://" + addr, func(key string) string {
				resp, err := http.Get("http://" + addr + "/" + key)
				if err != nil {
					return ""
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				return string(body)
			}
		}},
		{"PostgreSQL table", func(t *testing.T) (string, func(string) string) {
			dsn := pgtest.DSN(t)
			return dsn, func(key string) string {
				conn, err := pgx.Connect(context.Background(), dsn)
				if err != nil {
					return ""
				}
				defer conn.Close(context.Background())
				var v string
				_ = conn.QueryRow(context.Background(), `SELECT value FROM fenced_orders WHERE id = $1`, key).Scan(&v)
				return v
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, read := tc.target(t)
			// A fresh key: a database outlives the test's server and its tokens.
			key := fmt.Sprintf("orders/%d", time.Now().UnixNano())
			common := []string{"--endpoints", srv.addr, "--ttl", "1s", "--key", key, "--lock", "lock-" + key, "--target", target}
			a := startExample(t, "worker A", append([]string{"worker", "--name", "A", "--delay", "3s"}, common...)...)
			waitFor(t, 10*time.Second, "A to get the lock", func() bool {
				a.failIfExited(t)
				return strings.Contains(a.stdout.String(), "got lock")
			})
			a.signal(t, syscall.SIGSTOP)
			b := startExample(t, "worker B", append([]string{"worker", "--name", "B"}, common...)...)
			if code := b.waitExit(t, 20*time.Second); code != 0 {
				t.Fatalf("worker B exited %d:\n%s%s", code, b.stdout.String(), b.Stderr())
			}
			if got := read(key); got != "B" {
				t.Fatalf("after B's write the resource holds %q, want B", got)
			}
			a.signal(t, syscall.SIGCONT)
			code := a.waitExit(t, 20*time.Second)
			out := a.stdout.String()
			if code != 2 || !strings.Contains(out, "write REJECTED") || !strings.Contains(out, "stale fencing token") {
				t.Fatalf("worker A exited %d, want 2 with its stale write rejected:\n%s%s", code, out, a.Stderr())
			}
			if got := read(key); got != "B" {
				t.Fatalf("after A's late write the resource holds %q, want B's value to survive", got)
			}
		})
	}
}

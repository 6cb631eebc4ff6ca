// Command fenced-storage plays the article's story with real processes: a
// storage service that checks fencing tokens, and workers that take a lock
// from fence and write.
//
//	fenced-storage storage --listen 127.0.0.1:8080 --db tokens.db
//	fenced-storage worker --name A --key orders/17 --value A --delay 5s --target http://127.0.0.1:8080
//	fenced-storage worker --name B --key orders/17 --value B --target kv
//
// A worker takes the lock (named after the key's first path segment unless
// --lock says otherwise), prints its token, waits --delay ("work", during
// which it may be paused with SIGSTOP), then writes its value with the token
// it was granted, without checking whether it still holds the lock: that is
// what a process does that wakes from a pause. The storage, not the lock,
// refuses the stale write. Exit status: 0 written, 2 refused as stale, 1 error.
//
// The program imports only fence's public packages, so it can be copied out
// of the repository as it is. The storage's plain key-value part and its
// HTTP write are in storage.go; what this program shows is the fencing
// around them: the guard in front of the storage, and the token that goes
// with each write.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/client"
	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/fencing/boltfence"
	"github.com/fencelock/fence/fencing/pgfence"
	"github.com/jackc/pgx/v5"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: fenced-storage storage|worker [flags]")
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "storage":
		err = runStorage(ctx, os.Args[2:])
	case "worker":
		err = runWorker(ctx, os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q: want storage or worker", os.Args[1])
	}
	if errors.Is(err, fence.ErrStaleToken) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fenced-storage:", err)
		os.Exit(1)
	}
}

func runStorage(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("storage", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "address to serve on")
	db := fs.String("db", "", "bbolt file for the highest tokens (default: in memory)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var tokens fencing.Store = fencing.NewMemory()
	if *db != "" {
		s, err := boltfence.Open(*db)
		if err != nil {
			return err
		}
		tokens = s
	}
	defer tokens.Close()
	data := &values{m: map[string]string{}} // the last value per key: GET and PUT /KEY
	// The guard admits a write only with a token at least as high as any it
	// accepted for the key before; a stale one gets 409 Conflict.
	guard := fencing.NewGuard(tokens)
	handler := fencing.Middleware(guard, fencing.WithKey(func(r *http.Request) string {
		return strings.TrimPrefix(r.URL.Path, "/")
	}))(data)
	rejecting := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusWriter{ResponseWriter: w}
		handler.ServeHTTP(rec, r)
		if rec.code == http.StatusConflict {
			fmt.Printf("%s storage: REJECTED %s with token %s: stale\n", stamp(), r.URL.Path, r.Header.Get(fencing.HeaderToken))
		}
	})
	srv := &http.Server{Addr: *listen, Handler: rejecting, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	fmt.Printf("%s storage: serving on %s\n", stamp(), *listen)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func runWorker(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	name := fs.String("name", "worker", "the worker's name in the output")
	endpoints := fs.String("endpoints", envOr("FENCE_ENDPOINTS", client.DefaultEndpoint), "fence nodes")
	key := fs.String("key", "orders/17", "key to write")
	lockName := fs.String("lock", "", "lock to take (default: the key's first path segment)")
	value := fs.String("value", "", "value to write (default: the worker's name)")
	target := fs.String("target", "kv", `where to write: "kv" (fence's fenced KV), the storage's URL, or a postgres:// DSN (table fenced_orders)`)
	ttl := fs.Duration("ttl", 2*time.Second, "session TTL")
	delay := fs.Duration("delay", 0, "time between taking the lock and writing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *lockName == "" {
		*lockName, _, _ = strings.Cut(*key, "/")
	}
	if *value == "" {
		*value = *name
	}
	c, err := client.New(client.WithEndpoints(strings.Split(*endpoints, ",")...))
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := c.NewSession(ctx, client.WithTTL(*ttl), client.WithOwner("worker "+*name))
	if err != nil {
		return err
	}
	defer s.Close(context.Background())
	m := client.NewMutex(s, *lockName)
	g, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s: got lock %s with token %d\n", stamp(), *name, *lockName, g.Token())
	time.Sleep(*delay) // a paused process resumes here, believing it holds the lock
	fmt.Printf("%s %s: writing %s=%q with token %d\n", stamp(), *name, *key, *value, g.Token())
	switch {
	case *target == "kv":
		_, err = c.KV().Put(context.Background(), *key, []byte(*value), client.FencedBy(*lockName, g.Token()))
	case strings.HasPrefix(*target, "postgres://") || strings.HasPrefix(*target, "postgresql://"):
		err = putSQL(*target, *key, *value, g.Token())
	default:
		// The token goes with the write, in the request's headers.
		err = put(fencing.WithToken(context.Background(), *lockName, g.Token()), *target+"/"+*key, *value)
	}
	if err != nil {
		fmt.Printf("%s %s: write REJECTED: %v\n", stamp(), *name, err)
		return err
	}
	fmt.Printf("%s %s: write accepted\n", stamp(), *name)
	_ = m.Unlock(context.Background())
	return nil
}

// putSQL writes the value into a row of fenced_orders (created if missing)
// with pgfence's one-statement fenced upsert.
func putSQL(dsn, key, value string, token uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS fenced_orders (id text PRIMARY KEY, value text NOT NULL)`); err != nil {
		return err
	}
	if err := pgfence.AddTokenColumn(ctx, conn, "fenced_orders", ""); err != nil {
		return err
	}
	return pgfence.Upsert(ctx, conn, pgfence.UpsertRow{
		Table: "fenced_orders",
		Key:   []pgfence.Column{{Name: "id", Value: key}},
		Set:   []pgfence.Column{{Name: "value", Value: value}},
		Token: token,
	})
}

func stamp() string { return time.Now().Format("15:04:05.000") }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

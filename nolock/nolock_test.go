package nolock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the "sqlite" driver

	"github.com/fencelock/fence/fencing/sqlitefence"
	"github.com/fencelock/fence/internal/testutil/pgtest"
	"github.com/fencelock/fence/nolock"
)

// database is one of the databases the tests run against.
type database struct {
	name    string
	dialect nolock.Dialect
	open    func(t *testing.T) *sql.DB
}

// databases are a real SQLite file and a real PostgreSQL server (a schema of
// its own per test; skipped without one, failed under CI).
var databases = []database{
	{"SQLite", nolock.SQLite, func(t *testing.T) *sql.DB {
		return openDB(t, "sqlite", sqlitefence.DSN(filepath.Join(t.TempDir(), "nolock.db")))
	}},
	{"PostgreSQL", nolock.Postgres, func(t *testing.T) *sql.DB {
		return openDB(t, "pgx", pgtest.Schema(t))
	}},
}

func openDB(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func forEachDB(t *testing.T, test func(t *testing.T, ctx context.Context, db *sql.DB, d nolock.Dialect)) {
	for _, dbase := range databases {
		t.Run(dbase.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			test(t, ctx, dbase.open(t), dbase.dialect)
		})
	}
}

func mustExec(t *testing.T, ctx context.Context, db nolock.Execer, query string, args ...any) {
	t.Helper()
	if _, err := db.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
}

// Thirty concurrent buyers of ten items: exactly ten get one, the rest are
// told it is sold out, and the stock ends at zero, never below.
func TestDecrement(t *testing.T) {
	forEachDB(t, func(t *testing.T, ctx context.Context, db *sql.DB, d nolock.Dialect) {
		mustExec(t, ctx, db, `CREATE TABLE "stock items" (sku TEXT PRIMARY KEY, "select" INTEGER NOT NULL)`)
		mustExec(t, ctx, db, `INSERT INTO "stock items" VALUES ('A1', 10)`)
		c := nolock.Counter{Table: "stock items", Key: []nolock.Column{{Name: "sku", Value: "A1"}}, Column: "select"}
		var sold, soldOut atomic.Int64
		var wg sync.WaitGroup
		for range 30 {
			wg.Go(func() {
				left, err := nolock.Decrement(ctx, db, d, c, 1)
				switch {
				case err == nil:
					sold.Add(1)
					if left < 0 || left > 9 {
						t.Errorf("left %d after a sale", left)
					}
				case errors.Is(err, nolock.ErrInsufficient):
					soldOut.Add(1)
				default:
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var qty int64
		if err := db.QueryRowContext(ctx, `SELECT "select" FROM "stock items"`).Scan(&qty); err != nil {
			t.Fatal(err)
		}
		if sold.Load() != 10 || soldOut.Load() != 20 || qty != 0 {
			t.Fatalf("sold %d, sold out %d, stock %d; want 10, 20, 0", sold.Load(), soldOut.Load(), qty)
		}
		if _, err := nolock.Decrement(ctx, db, d, nolock.Counter{Table: "stock items", Key: []nolock.Column{{Name: "sku", Value: "B2"}}, Column: "select"}, 1); !errors.Is(err, nolock.ErrNoRow) {
			t.Fatalf("decrement of a missing row: %v, want ErrNoRow", err)
		}
		if _, err := nolock.Decrement(ctx, db, d, c, 0); !errors.Is(err, nolock.ErrInvalid) {
			t.Fatalf("decrement by 0: %v, want ErrInvalid", err)
		}
	})
}

// Read-modify-write with a version column: a write from a stale read is
// refused with ErrConflict, and concurrent increments retried with
// Optimistic lose none.
func TestUpdateVersioned(t *testing.T) {
	forEachDB(t, func(t *testing.T, ctx context.Context, db *sql.DB, d nolock.Dialect) {
		mustExec(t, ctx, db, `CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL, version INTEGER NOT NULL)`)
		mustExec(t, ctx, db, `INSERT INTO accounts VALUES (1, 0, 1)`)
		key := []nolock.Column{{Name: "id", Value: 1}}
		read := func() (balance, version int64) {
			t.Helper()
			if err := db.QueryRowContext(ctx, `SELECT balance, version FROM accounts WHERE id = 1`).Scan(&balance, &version); err != nil {
				t.Fatal(err)
			}
			return balance, version
		}
		_, v := read()
		if nv, err := nolock.UpdateVersioned(ctx, db, d, nolock.VersionedRow{Table: "accounts", Key: key, Set: []nolock.Column{{Name: "balance", Value: 5}}, Version: v}); err != nil || nv != v+1 {
			t.Fatalf("update at the version read: %d, %v", nv, err)
		}
		if _, err := nolock.UpdateVersioned(ctx, db, d, nolock.VersionedRow{Table: "accounts", Key: key, Set: []nolock.Column{{Name: "balance", Value: 99}}, Version: v}); !errors.Is(err, nolock.ErrConflict) {
			t.Fatalf("update from a stale read: %v, want ErrConflict", err)
		}
		if _, err := nolock.UpdateVersioned(ctx, db, d, nolock.VersionedRow{Table: "accounts", Key: []nolock.Column{{Name: "id", Value: 2}}, Version: 1}); !errors.Is(err, nolock.ErrNoRow) {
			t.Fatalf("update of a missing row: %v, want ErrNoRow", err)
		}
		const workers, each = 8, 10
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for range each {
					err := nolock.Optimistic(ctx, 1000, func(ctx context.Context) error {
						var balance, version int64
						if err := db.QueryRowContext(ctx, `SELECT balance, version FROM accounts WHERE id = 1`).Scan(&balance, &version); err != nil {
							return err
						}
						_, err := nolock.UpdateVersioned(ctx, db, d, nolock.VersionedRow{Table: "accounts", Key: key, Set: []nolock.Column{{Name: "balance", Value: balance + 1}}, Version: version})
						return err
					})
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if balance, _ := read(); balance != 5+workers*each {
			t.Fatalf("balance %d after %d increments from 5, want %d: increments were lost", balance, workers*each, 5+workers*each)
		}
	})
}

// Ten workers race to run one job: it runs once, its write commits with the
// key, and a job that fails leaves the key free for the next try.
func TestOnce(t *testing.T) {
	forEachDB(t, func(t *testing.T, ctx context.Context, db *sql.DB, d nolock.Dialect) {
		if err := nolock.CreateKeyTable(ctx, db, d, "job keys"); err != nil {
			t.Fatal(err)
		}
		if err := nolock.CreateKeyTable(ctx, db, d, "job keys"); err != nil {
			t.Fatalf("creating the table again: %v", err)
		}
		mustExec(t, ctx, db, `CREATE TABLE reports (day TEXT NOT NULL)`)
		var ran atomic.Int64
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				did, err := nolock.Once(ctx, db, d, "job keys", "report/2026-12-02", func(ctx context.Context, tx *sql.Tx) error {
					_, err := tx.ExecContext(ctx, `INSERT INTO reports VALUES ('2026-12-02')`)
					return err
				})
				if err != nil {
					t.Error(err)
				}
				if did {
					ran.Add(1)
				}
			})
		}
		wg.Wait()
		var reports int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM reports`).Scan(&reports); err != nil {
			t.Fatal(err)
		}
		if ran.Load() != 1 || reports != 1 {
			t.Fatalf("the job ran %d times and wrote %d reports; want once", ran.Load(), reports)
		}

		boom := errors.New("boom")
		if did, err := nolock.Once(ctx, db, d, "job keys", "flaky", func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO reports VALUES ('flaky')`); err != nil {
				return err
			}
			return boom
		}); did || !errors.Is(err, boom) {
			t.Fatalf("failing job: ran %v, %v", did, err)
		}
		if did, err := nolock.Once(ctx, db, d, "job keys", "flaky", func(ctx context.Context, tx *sql.Tx) error { return nil }); !did || err != nil {
			t.Fatalf("retry of a failed job: ran %v, %v; want it run", did, err)
		}
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM reports WHERE day = 'flaky'`).Scan(&reports); err != nil || reports != 0 {
			t.Fatalf("the failed job's write: %d rows, %v; want it rolled back", reports, err)
		}
		if err := nolock.Forget(ctx, db, d, "job keys", "flaky"); err != nil {
			t.Fatal(err)
		}
		if did, err := nolock.Once(ctx, db, d, "job keys", "flaky", func(ctx context.Context, tx *sql.Tx) error { return nil }); !did || err != nil {
			t.Fatalf("a forgotten key: ran %v, %v; want it run again", did, err)
		}
	})
}

// Concurrent deliveries of one event with the same idempotency key: the
// handler runs once and every delivery gets its result.
func TestIdempotent(t *testing.T) {
	forEachDB(t, func(t *testing.T, ctx context.Context, db *sql.DB, d nolock.Dialect) {
		if err := nolock.CreateKeyTable(ctx, db, d, "processed"); err != nil {
			t.Fatal(err)
		}
		var runs atomic.Int64
		handle := func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
			n := runs.Add(1)
			return fmt.Appendf(nil, "receipt %d", n), nil
		}
		results := make(chan string, 8)
		replays := make(chan bool, 8)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				res, replayed, err := nolock.Idempotent(ctx, db, d, "processed", "event-17", handle)
				if err != nil {
					t.Error(err)
					return
				}
				results <- string(res)
				replays <- replayed
			})
		}
		wg.Wait()
		close(results)
		close(replays)
		fresh := 0
		for r := range replays {
			if !r {
				fresh++
			}
		}
		for r := range results {
			if r != "receipt 1" {
				t.Errorf("a delivery got %q, want the first run's receipt 1", r)
			}
		}
		if runs.Load() != 1 || fresh != 1 {
			t.Fatalf("handler ran %d times, %d deliveries not replayed; want 1 and 1", runs.Load(), fresh)
		}
		if res, replayed, err := nolock.Idempotent(ctx, db, d, "processed", "event-18", handle); err != nil || replayed || string(res) != "receipt 2" {
			t.Fatalf("another key: %q, replayed %v, %v", res, replayed, err)
		}
		if _, _, err := nolock.Idempotent(ctx, db, d, "processed", "", handle); !errors.Is(err, nolock.ErrInvalid) {
			t.Fatalf("empty key: %v, want ErrInvalid", err)
		}
	})
}

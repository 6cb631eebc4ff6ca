package sqlitefence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fencing/fencingtest"
	"github.com/fencelock/fence/fencing/sqlitefence"
	"github.com/fencelock/fence/internal/sqlgen"
	"github.com/fencelock/fence/internal/testutil/rowtest"
)

var ctx = context.Background()

func mustOpen(t testing.TB, path string) *sqlitefence.Store {
	t.Helper()
	s, err := sqlitefence.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustDB(t testing.TB, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open(sqlitefence.DriverName, sqlitefence.DSN(path))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestConformance runs the suite on Stores from Open, each on a file of its
// own; reopening one opens a new *sql.DB on the same file.
func TestConformance(t *testing.T) {
	t.Parallel()
	tempFile := func(t testing.TB) string { return filepath.Join(t.TempDir(), "tokens.db") }
	fencingtest.Run(t, fencingtest.Durable(tempFile, mustOpen))
}

// TestAdmitTxCommitsWithTheToken: the write's statements commit with the
// token, and roll back with it when the write fails or panics or the token
// is stale.
func TestAdmitTxCommitsWithTheToken(t *testing.T) {
	t.Parallel()
	db := mustDB(t, filepath.Join(t.TempDir(), "app.db"))
	s, err := sqlitefence.New(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := db.Exec(`CREATE TABLE balances (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	fencingtest.RunTx(t, s, fencingtest.Balance[*sql.Tx]{
		Set: func(tx *sql.Tx, amount int) error {
			_, err := tx.Exec(`INSERT INTO balances VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET amount = excluded.amount`, amount)
			return err
		},
		Get: func() (amount int, err error) {
			err = db.QueryRow(`SELECT amount FROM balances WHERE id = 1`).Scan(&amount)
			return amount, err
		},
		Tx: sqlitefence.Tx,
	})
}

// TestTokenAboveMaxInt64: a token must fit SQLite's signed 64-bit integers.
func TestTokenAboveMaxInt64(t *testing.T) {
	t.Parallel()
	s := mustOpen(t, filepath.Join(t.TempDir(), "tokens.db"))
	defer s.Close()
	if err := s.Admit(ctx, "k", math.MaxInt64+1, func(context.Context) error { return nil }); !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("token 2^63: %v, want ErrInvalidArgument", err)
	}
}

// TestPathsThatNeedEscaping: DSN makes a file: URI of any path.
func TestPathsThatNeedEscaping(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"a b.db", "what?.db", "#1.db", "100%.db", "a&b=c.db"} {
		path := filepath.Join(dir, name)
		s := mustOpen(t, path)
		if err := s.Admit(ctx, "k", 1, func(context.Context) error { return nil }); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		s.Close()
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("%s: the database is not where it was asked to be: %v", name, err)
		}
	}
	// A relative path too.
	wd, _ := os.Getwd()
	rel, err := filepath.Rel(wd, filepath.Join(dir, "rel.db"))
	if err != nil {
		t.Fatal(err)
	}
	s := mustOpen(t, rel)
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "rel.db")); err != nil {
		t.Fatal(err)
	}
}

func TestRows(t *testing.T) {
	t.Parallel()
	rowtest.Run(t, rowtest.Backend{
		Dialect: sqlgen.SQLite,
		New: func(t *testing.T) rowtest.DB {
			return liteDB{mustDB(t, filepath.Join(t.TempDir(), "rows.db"))}
		},
	})
}

// TestUpdateInCallersTransaction: Update runs inside the caller's *sql.Tx
// and rolls back with it.
func TestUpdateInCallersTransaction(t *testing.T) {
	t.Parallel()
	db := mustDB(t, filepath.Join(t.TempDir(), "app.db"))
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT NOT NULL); INSERT INTO orders VALUES (17, 'new')`); err != nil {
		t.Fatal(err)
	}
	if err := sqlitefence.AddTokenColumn(ctx, db, "orders", ""); err != nil {
		t.Fatal(err)
	}
	update := func(q sqlitefence.Querier, status string, token uint64) error {
		return sqlitefence.Update(ctx, q, sqlitefence.UpdateRow{
			Table: "orders",
			Set:   []sqlitefence.Column{{Name: "status", Value: status}},
			Where: []sqlitefence.Column{{Name: "id", Value: 17}},
			Token: token,
		})
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if err := update(tx, "paid", 34); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := update(db, "shipped", 33); err != nil {
		t.Fatal(err)
	}
	err = update(db, "late", 32)
	if want := "stale fencing token 32 < 33 for key orders/17"; err == nil || err.Error() != want {
		t.Fatalf("stale update: %v, want %q", err, want)
	}
	// The column is found whatever its case, as SQLite finds it.
	if err := sqlitefence.AddTokenColumn(ctx, db, "orders", "FENCE_TOKEN"); err != nil {
		t.Fatal(err)
	}
}

// TestProcessesShareAFile runs writers in separate processes (this test
// binary, run again as TestWriterProcess) on one SQLite file. Each writer
// records what it applied in a table inside its Admit's transaction; no
// writer may fail with SQLITE_BUSY, and no lower token may be applied after
// a higher one.
func TestProcessesShareAFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "shared.db")
	s := mustOpen(t, path)
	defer s.Close()
	if _, err := s.DB().ExecContext(ctx, `CREATE TABLE applied (seq INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL, proc INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	const procs = 4
	var wg sync.WaitGroup
	outs := make([][]byte, procs)
	errs := make([]error, procs)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	for p := range procs {
		wg.Go(func() {
			cmd := exec.Command(os.Args[0], "-test.run=^TestWriterProcess$", "-test.v")
			cmd.Env = append(os.Environ(), "SQLITEFENCE_WRITER_DB="+path, "SQLITEFENCE_WRITER="+strconv.Itoa(p), fmt.Sprint("SQLITEFENCE_SEED=", seed))
			outs[p], errs[p] = cmd.CombinedOutput()
		})
	}
	// Start them together, once all have opened the store.
	for p := range procs {
		waitFor(t, fmt.Sprintf("%s.ready.%d", path, p))
	}
	if err := os.WriteFile(path+".go", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for p := range procs {
		if errs[p] != nil {
			t.Errorf("writer process %d: %v\n%s", p, errs[p], outs[p])
		}
	}
	if t.Failed() {
		return
	}
	var s1, t1, s2, t2 int64
	err := s.DB().QueryRowContext(ctx, `SELECT a.seq, a.token, b.seq, b.token FROM applied a JOIN applied b ON a.seq < b.seq AND a.token > b.token LIMIT 1`).Scan(&s1, &t1, &s2, &t2)
	if err == nil {
		t.Fatalf("token %d was applied (log %d) after token %d (log %d)", t2, s2, t1, s1)
	}
	var n, maxApplied, writers int64
	if err := s.DB().QueryRowContext(ctx, `SELECT count(*), max(token), count(DISTINCT proc) FROM applied`).Scan(&n, &maxApplied, &writers); err != nil {
		t.Fatal(err)
	}
	highest, err := s.Highest(ctx, "shared")
	if err != nil || uint64(maxApplied) != highest || n == 0 {
		t.Fatalf("highest %d, %v; %d writes applied, up to token %d", highest, err, n, maxApplied)
	}
	t.Logf("%d writes applied by %d processes, up to token %d", n, writers, maxApplied)
}

// TestWriterProcess is one writer of TestProcessesShareAFile.
func TestWriterProcess(t *testing.T) {
	path := os.Getenv("SQLITEFENCE_WRITER_DB")
	if path == "" {
		t.Skip("run by TestProcessesShareAFile")
	}
	p, _ := strconv.Atoi(os.Getenv("SQLITEFENCE_WRITER"))
	seed, _ := strconv.ParseUint(os.Getenv("SQLITEFENCE_SEED"), 10, 64)
	s := mustOpen(t, path)
	defer s.Close()
	rng := rand.New(rand.NewPCG(uint64(p), seed))
	if err := os.WriteFile(fmt.Sprintf("%s.ready.%d", path, p), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, path+".go")
	var accepted, stale int
	for i := range 40 {
		token := 1 + 2*uint64(i) + rng.Uint64N(12)
		err := s.AdmitTx(ctx, "shared", token, func(tx *sql.Tx) error {
			_, err := tx.Exec(`INSERT INTO applied (token, proc) VALUES (?1, ?2)`, int64(token), p)
			return err
		})
		switch {
		case err == nil:
			accepted++
		case errors.Is(err, fence.ErrStaleToken):
			stale++
		default:
			t.Fatalf("writer %d, token %d: %v", p, token, err)
		}
	}
	t.Logf("writer %d: %d accepted, %d stale", p, accepted, stale)
}

// waitFor waits for the file at path to exist, for up to a minute.
func waitFor(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear within a minute", path)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// liteDB adapts a *sql.DB to the row-level suite.
type liteDB struct{ db *sql.DB }

func (d liteDB) Exec(ctx context.Context, query string, args ...any) error {
	_, err := d.db.ExecContext(ctx, query, args...)
	return err
}

func (d liteDB) QueryRow(ctx context.Context, query string, args ...any) rowtest.Row {
	return d.db.QueryRowContext(ctx, query, args...)
}

func (d liteDB) Update(ctx context.Context, w rowtest.Write) error {
	return sqlitefence.Update(ctx, d.db, w.UpdateRow())
}

func (d liteDB) Upsert(ctx context.Context, w rowtest.Write) error {
	return sqlitefence.Upsert(ctx, d.db, w.UpsertRow())
}

func (d liteDB) AddTokenColumn(ctx context.Context, table, column string) error {
	return sqlitefence.AddTokenColumn(ctx, d.db, table, column)
}

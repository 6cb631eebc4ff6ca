package pgfence_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/fencing/fencingtest"
	"github.com/fencelock/fence/fencing/pgfence"
	"github.com/fencelock/fence/internal/sqlgen"
	"github.com/fencelock/fence/internal/testutil/pgtest"
	"github.com/fencelock/fence/internal/testutil/rowtest"
)

var ctx = context.Background()

func mustOpen(t testing.TB, dsn string) *pgfence.Store {
	t.Helper()
	s, err := pgfence.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestConformance runs the suite on Stores from Open, each in a schema of
// its own; reopening one opens a new pool, with new connections.
func TestConformance(t *testing.T) {
	t.Parallel()
	pgtest.DSN(t)
	fencingtest.Run(t, fencingtest.Durable(pgtest.Schema, mustOpen))
}

// TestConformanceOnConn runs the suite on a Store from New on one
// *pgx.Conn, serialized by a mutex since a Conn is not concurrency-safe.
func TestConformanceOnConn(t *testing.T) {
	t.Parallel()
	pgtest.DSN(t)
	fencingtest.Run(t, fencingtest.Factory{
		Open: func(t *testing.T) fencing.Store {
			conn, err := pgx.Connect(ctx, pgtest.Schema(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close(ctx) })
			s, err := pgfence.New(ctx, conn)
			if err != nil {
				t.Fatal(err)
			}
			return &serialized{s: s}
		},
	})
}

type serialized struct {
	mu sync.Mutex
	s  *pgfence.Store
}

func (s *serialized) Admit(ctx context.Context, key string, token uint64, write func(context.Context) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Admit(ctx, key, token, write)
}

func (s *serialized) Highest(ctx context.Context, key string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.s.Highest(ctx, key)
}

func (s *serialized) Close() error { return s.s.Close() }

// TestAdmitTxCommitsWithTheToken: the write's statements commit with the
// token, and roll back with it when the write fails or panics or the token
// is stale.
func TestAdmitTxCommitsWithTheToken(t *testing.T) {
	t.Parallel()
	pool := mustPool(t, pgtest.Schema(t))
	s, err := pgfence.New(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE balances (id int PRIMARY KEY, amount int NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	fencingtest.RunTx(t, s, fencingtest.Balance[pgx.Tx]{
		Set: func(tx pgx.Tx, amount int) error {
			_, err := tx.Exec(ctx, `INSERT INTO balances VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET amount = EXCLUDED.amount`, amount)
			return err
		},
		Get: func() (amount int, err error) {
			err = pool.QueryRow(ctx, `SELECT amount FROM balances WHERE id = 1`).Scan(&amount)
			return amount, err
		},
		Tx: pgfence.Tx,
	})
}

func TestTokenAboveMaxInt64(t *testing.T) {
	t.Parallel()
	s := mustOpen(t, pgtest.Schema(t))
	defer s.Close()
	err := s.Admit(ctx, "k", math.MaxInt64+1, func(context.Context) error { t.Error("write ran"); return nil })
	if !errors.Is(err, fence.ErrInvalidArgument) {
		t.Fatalf("token 2^63: %v, want ErrInvalidArgument", err)
	}
	if err := s.Admit(ctx, "k", math.MaxInt64, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("token 2^63-1: %v", err)
	}
	if h, err := s.Highest(ctx, "k"); err != nil || h != math.MaxInt64 {
		t.Fatalf("highest %d, %v", h, err)
	}
}

// TestStoresShareTheTable: two Stores on separate pools (as two processes
// would have) fence each other, and concurrent New calls on an empty
// schema all succeed.
func TestStoresShareTheTable(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Schema(t)
	stores := make([]*pgfence.Store, 4)
	errs := make([]error, len(stores))
	var wg sync.WaitGroup
	for i := range stores {
		wg.Go(func() { stores[i], errs[i] = pgfence.Open(ctx, dsn) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Open %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	if err := stores[0].Admit(ctx, "k", 10, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := stores[1].Admit(ctx, "k", 9, func(context.Context) error { return nil }); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("the other store admitted a stale token: %v", err)
	}
}

func TestRows(t *testing.T) {
	t.Parallel()
	pgtest.DSN(t)
	rowtest.Run(t, rowtest.Backend{
		Dialect: sqlgen.Postgres,
		New: func(t *testing.T) rowtest.DB {
			return pgDB{mustPool(t, pgtest.Schema(t))}
		},
	})
}

// TestUpdateInCallersTransaction: Update runs inside the caller's pgx.Tx
// and rolls back with it.
func TestUpdateInCallersTransaction(t *testing.T) {
	t.Parallel()
	pool := mustPool(t, pgtest.Schema(t))
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id int PRIMARY KEY, status text NOT NULL); INSERT INTO orders VALUES (17, 'new')`); err != nil {
		t.Fatal(err)
	}
	if err := pgfence.AddTokenColumn(ctx, pool, "orders", ""); err != nil {
		t.Fatal(err)
	}
	update := func(db pgfence.Querier, status string, token uint64) error {
		return pgfence.Update(ctx, db, pgfence.UpdateRow{
			Table: "orders",
			Set:   []pgfence.Column{{Name: "status", Value: status}},
			Where: []pgfence.Column{{Name: "id", Value: 17}},
			Token: token,
		})
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := update(tx, "paid", 34); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := update(pool, "shipped", 33); err != nil { // 34 was rolled back
		t.Fatal(err)
	}
	err = update(pool, "late", 32)
	if want := "stale fencing token 32 < 33 for key orders/17"; err == nil || err.Error() != want {
		t.Fatalf("stale update: %v, want %q", err, want)
	}
}

// pgDB adapts a pool to the row-level suite.
type pgDB struct{ pool *pgxpool.Pool }

func (d pgDB) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := d.pool.Exec(ctx, sql, args...)
	return err
}

func (d pgDB) QueryRow(ctx context.Context, sql string, args ...any) rowtest.Row {
	return d.pool.QueryRow(ctx, sql, args...)
}

func (d pgDB) Update(ctx context.Context, w rowtest.Write) error {
	return pgfence.Update(ctx, d.pool, w.UpdateRow())
}

func (d pgDB) Upsert(ctx context.Context, w rowtest.Write) error {
	return pgfence.Upsert(ctx, d.pool, w.UpsertRow())
}

func (d pgDB) AddTokenColumn(ctx context.Context, table, column string) error {
	return pgfence.AddTokenColumn(ctx, d.pool, table, column)
}

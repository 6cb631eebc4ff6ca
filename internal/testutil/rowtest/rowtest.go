package rowtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/sqlgen"
)

// Row is a row of a query result.
type Row interface {
	Scan(dest ...any) error
}

// Write is one fenced write, as the package under test takes it. For an
// update Key is the Where.
type Write struct {
	Table       string
	Key         []sqlgen.Column
	Set         []sqlgen.Column
	Token       uint64
	TokenColumn string
}

// UpdateRow is w as an update of the row w.Key identifies.
func (w Write) UpdateRow() sqlgen.UpdateRow {
	return sqlgen.UpdateRow{Table: w.Table, Set: w.Set, Where: w.Key, Token: w.Token, TokenColumn: w.TokenColumn}
}

// UpsertRow is w as an insert-or-update.
func (w Write) UpsertRow() sqlgen.UpsertRow {
	return sqlgen.UpsertRow{Table: w.Table, Key: w.Key, Set: w.Set, Token: w.Token, TokenColumn: w.TokenColumn}
}

// DB is a database handle of the package under test: plain statements,
// and its fenced helpers.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) error
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Update(ctx context.Context, w Write) error
	Upsert(ctx context.Context, w Write) error
	AddTokenColumn(ctx context.Context, table, column string) error
}

// Backend makes the databases under test.
type Backend struct {
	Dialect sqlgen.Dialect
	// New returns a handle on a new, empty database (or schema) for t,
	// which it cleans up. It may be called concurrently.
	New func(t *testing.T) DB
}

// Run runs the suite as subtests of t, in parallel.
func Run(t *testing.T, b Backend) {
	for name, test := range map[string]func(t *testing.T, b Backend){
		"AddTokenColumnToTableWithRows": addTokenColumn,
		"UpdateStaleRejected":           updateStale,
		"UpdateEqualAndHigherAccepted":  updateEqualAndHigher,
		"UpdateMissingRow":              updateMissingRow,
		"UpsertInsertsThenFences":       upsertFences,
		"CompositeKey":                  compositeKey,
		"BadArguments":                  badArguments,
		"NamesThatNeedQuoting":          quotedNames,
		"ConcurrentWriters":             concurrentWriters,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, b)
		})
	}
}

var ctx = context.Background()

const table = "order items" // a name that needs quoting, as is the column "select"

func exec(t *testing.T, db DB, sql string, args ...any) {
	t.Helper()
	if err := db.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// ordersTable creates "order items"(id, "select") with rows 17 -> "a" and
// 18 -> "b", and its token column fence_token.
func ordersTable(t *testing.T, b Backend) DB {
	t.Helper()
	db := b.New(t)
	exec(t, db, `CREATE TABLE "order items" (id bigint NOT NULL PRIMARY KEY, "select" text NOT NULL)`)
	exec(t, db, `INSERT INTO "order items" (id, "select") VALUES (17, 'a'), (18, 'b')`)
	if err := db.AddTokenColumn(ctx, table, ""); err != nil {
		t.Fatalf("AddTokenColumn: %v", err)
	}
	return db
}

func row(t *testing.T, b Backend, db DB, id int64) (value string, token int64) {
	t.Helper()
	err := db.QueryRow(ctx, `SELECT "select", fence_token FROM "order items" WHERE id = `+b.Dialect.Placeholder(1), id).Scan(&value, &token)
	if err != nil {
		t.Fatalf("reading row %d: %v", id, err)
	}
	return value, token
}

func wantRow(t *testing.T, b Backend, db DB, id int64, value string, token int64) {
	t.Helper()
	if v, tok := row(t, b, db, id); v != value || tok != token {
		t.Fatalf("row %d = (%q, token %d), want (%q, token %d)", id, v, tok, value, token)
	}
}

func set(id int64, value string, token uint64) Write {
	return Write{
		Table: table,
		Key:   []sqlgen.Column{{Name: "id", Value: id}},
		Set:   []sqlgen.Column{{Name: "select", Value: value}},
		Token: token,
	}
}

func mustWrite(t *testing.T, write func(context.Context, Write) error, w Write) {
	t.Helper()
	if err := write(ctx, w); err != nil {
		t.Fatalf("write with token %d: %v", w.Token, err)
	}
}

func wantStale(t *testing.T, err error, key string, token, highest uint64) {
	t.Helper()
	var stale *fence.StaleTokenError
	if !errors.Is(err, fence.ErrStaleToken) || !errors.As(err, &stale) {
		t.Fatalf("got %v, want a *fence.StaleTokenError", err)
	}
	if stale.Key != key || stale.Token != token || stale.Highest != highest {
		t.Fatalf("got %+v, want key %q, token %d, highest %d", *stale, key, token, highest)
	}
	if want := fmt.Sprintf("stale fencing token %d < %d for key %s", token, highest, key); err.Error() != want {
		t.Fatalf("message %q, want %q", err.Error(), want)
	}
}

func addTokenColumn(t *testing.T, b Backend) {
	db := b.New(t)
	exec(t, db, `CREATE TABLE "order items" (id bigint NOT NULL PRIMARY KEY, "select" text NOT NULL)`)
	exec(t, db, `INSERT INTO "order items" (id, "select") VALUES (17, 'a'), (18, 'b'), (19, 'c')`)
	for range 2 { // idempotent
		if err := db.AddTokenColumn(ctx, table, ""); err != nil {
			t.Fatalf("AddTokenColumn: %v", err)
		}
	}
	var rows, zero int64
	if err := db.QueryRow(ctx, `SELECT count(*), sum(CASE WHEN fence_token = 0 THEN 1 ELSE 0 END) FROM "order items"`).Scan(&rows, &zero); err != nil {
		t.Fatal(err)
	}
	if rows != 3 || zero != 3 {
		t.Fatalf("%d rows, %d with token 0; want 3 and 3", rows, zero)
	}
	if err := db.Exec(ctx, `INSERT INTO "order items" (id, "select", fence_token) VALUES (20, 'd', NULL)`); err == nil {
		t.Fatal("the token column accepts NULL")
	}
	exec(t, db, `INSERT INTO "order items" (id, "select") VALUES (21, 'e')`)
	wantRow(t, b, db, 21, "e", 0)
	mustWrite(t, db.Update, set(17, "x", 1)) // any token beats the default 0
	wantRow(t, b, db, 17, "x", 1)

	// A named column, concurrently from several callers.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Go(func() { errs <- db.AddTokenColumn(ctx, table, "lease token") })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent AddTokenColumn: %v", err)
		}
	}
	w := set(18, "y", 5)
	w.TokenColumn = "lease token"
	mustWrite(t, db.Update, w)
	w.Token = 4
	wantStale(t, db.Update(ctx, w), "order items/18", 4, 5)

	if err := db.AddTokenColumn(ctx, "no such table", ""); err == nil {
		t.Fatal("AddTokenColumn of a missing table succeeded")
	}
}

func updateStale(t *testing.T, b Backend) {
	db := ordersTable(t, b)
	mustWrite(t, db.Update, set(17, "from 34", 34))
	wantStale(t, db.Update(ctx, set(17, "from 33", 33)), "order items/17", 33, 34)
	wantRow(t, b, db, 17, "from 34", 34)
	wantStale(t, db.Update(ctx, set(17, "from 1", 1)), "order items/17", 1, 34)
	wantRow(t, b, db, 17, "from 34", 34)
	wantRow(t, b, db, 18, "b", 0) // the other row is untouched
}

func updateEqualAndHigher(t *testing.T, b Backend) {
	db := ordersTable(t, b)
	for i, token := range []uint64{7, 7, 7, 8, 1 << 40, math.MaxInt64} {
		value := fmt.Sprintf("write %d", i)
		mustWrite(t, db.Update, set(17, value, token))
		wantRow(t, b, db, 17, value, int64(token))
	}
	// Only the token: the holder marks the row as its own.
	mustWrite(t, db.Update, Write{Table: table, Key: []sqlgen.Column{{Name: "id", Value: 18}}, Token: 3})
	wantRow(t, b, db, 18, "b", 3)
}

func updateMissingRow(t *testing.T, b Backend) {
	db := ordersTable(t, b)
	err := db.Update(ctx, set(99, "x", 5))
	if !errors.Is(err, sqlgen.ErrNoRow) || errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("update of a missing row: %v, want ErrNoRow", err)
	}
	if !strings.Contains(err.Error(), "order items/99") {
		t.Fatalf("the error does not name the row: %v", err)
	}
	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM "order items"`).Scan(&n); err != nil || n != 2 {
		t.Fatalf("%d rows, %v; want the 2 there were", n, err)
	}
}

func upsertFences(t *testing.T, b Backend) {
	db := ordersTable(t, b)
	mustWrite(t, db.Upsert, set(30, "new", 5)) // inserts
	wantRow(t, b, db, 30, "new", 5)
	wantStale(t, db.Upsert(ctx, set(30, "stale", 4)), "order items/30", 4, 5)
	wantRow(t, b, db, 30, "new", 5)
	mustWrite(t, db.Upsert, set(30, "same holder", 5))
	wantRow(t, b, db, 30, "same holder", 5)
	mustWrite(t, db.Upsert, set(30, "next holder", 9))
	wantRow(t, b, db, 30, "next holder", 9)
	mustWrite(t, db.Upsert, set(17, "existing row", 2)) // a row from before the column: token 0
	wantRow(t, b, db, 17, "existing row", 2)
	if err := db.Update(ctx, set(30, "stale update", 8)); !errors.Is(err, fence.ErrStaleToken) {
		t.Fatalf("update after upsert: %v, want stale", err)
	}
}

func compositeKey(t *testing.T, b Backend) {
	db := b.New(t)
	exec(t, db, `CREATE TABLE lines (o bigint NOT NULL, line bigint NOT NULL, qty bigint NOT NULL, PRIMARY KEY (o, line))`)
	if err := db.AddTokenColumn(ctx, "lines", "tok"); err != nil {
		t.Fatal(err)
	}
	w := func(line, qty int64, token uint64) Write {
		return Write{
			Table: "lines", TokenColumn: "tok", Token: token,
			Key: []sqlgen.Column{{Name: "o", Value: int64(7)}, {Name: "line", Value: line}},
			Set: []sqlgen.Column{{Name: "qty", Value: qty}},
		}
	}
	mustWrite(t, db.Upsert, w(1, 10, 20))
	mustWrite(t, db.Upsert, w(2, 5, 3))
	wantStale(t, db.Update(ctx, w(1, 11, 19)), "lines/7/1", 19, 20)
	mustWrite(t, db.Update, w(2, 6, 19)) // line 2 has its own token
	var qty1, qty2 int64
	q := `SELECT (SELECT qty FROM lines WHERE o = 7 AND line = 1), (SELECT qty FROM lines WHERE o = 7 AND line = 2)`
	if err := db.QueryRow(ctx, q).Scan(&qty1, &qty2); err != nil || qty1 != 10 || qty2 != 6 {
		t.Fatalf("qty %d, %d, %v; want 10, 6", qty1, qty2, err)
	}
}

func badArguments(t *testing.T, b Backend) {
	db := ordersTable(t, b)
	mustWrite(t, db.Update, set(17, "kept", 5))
	for name, w := range map[string]Write{
		"token 0":          set(17, "x", 0),
		"token > MaxInt64": set(17, "x", math.MaxInt64+1),
		"no table":         {Key: []sqlgen.Column{{Name: "id", Value: 17}}, Token: 9},
		"no key":           {Table: table, Set: []sqlgen.Column{{Name: "select", Value: "x"}}, Token: 9},
		"unnamed column":   {Table: table, Key: []sqlgen.Column{{Name: "id", Value: 17}}, Set: []sqlgen.Column{{Value: "x"}}, Token: 9},
	} {
		for op, write := range map[string]func(context.Context, Write) error{"Update": db.Update, "Upsert": db.Upsert} {
			if err := write(ctx, w); !errors.Is(err, fence.ErrInvalidArgument) {
				t.Errorf("%s with %s: %v, want ErrInvalidArgument", op, name, err)
			}
		}
	}
	wantRow(t, b, db, 17, "kept", 5)
	// A column that does not exist is the database's error, not a stale token.
	w := set(17, "x", 9)
	w.Set = []sqlgen.Column{{Name: "no such column", Value: 1}}
	if err := db.Update(ctx, w); err == nil || errors.Is(err, fence.ErrStaleToken) || errors.Is(err, sqlgen.ErrNoRow) {
		t.Fatalf("update of a missing column: %v", err)
	}
	wantRow(t, b, db, 17, "kept", 5)
}

func quotedNames(t *testing.T, b Backend) {
	db := b.New(t)
	// Every name here would break an unquoted statement, and the quotes in
	// them would end a naively quoted one.
	exec(t, db, `CREATE TABLE "we""ird; DROP TABLE x; --" ("select" text NOT NULL PRIMARY KEY, "from" text NOT NULL)`)
	exec(t, db, `CREATE TABLE x (y bigint)`)
	tableName, tokenCol := `we"ird; DROP TABLE x; --`, `order"`
	if err := db.AddTokenColumn(ctx, tableName, tokenCol); err != nil {
		t.Fatal(err)
	}
	w := func(from string, token uint64) Write {
		return Write{
			Table: tableName, TokenColumn: tokenCol, Token: token,
			Key: []sqlgen.Column{{Name: "select", Value: "k"}},
			Set: []sqlgen.Column{{Name: "from", Value: from}},
		}
	}
	mustWrite(t, db.Upsert, w("first", 10))
	mustWrite(t, db.Update, w("second", 11))
	wantStale(t, db.Update(ctx, w("stale", 10)), tableName+"/k", 10, 11)
	wantStale(t, db.Upsert(ctx, w("stale", 10)), tableName+"/k", 10, 11)
	var from string
	var token int64
	err := db.QueryRow(ctx, `SELECT "from", "order""" FROM "we""ird; DROP TABLE x; --"`).Scan(&from, &token)
	if err != nil || from != "second" || token != 11 {
		t.Fatalf("row (%q, %d), %v; want (second, 11)", from, token, err)
	}
	exec(t, db, `SELECT y FROM x`) // still there
}

// concurrentWriters: writers with random tokens update and upsert one row
// at once. A trigger logs every row version in the order the database
// applied them. Property: no lower token was applied after a higher one,
// and the row ends with the highest token and that token's value.
func concurrentWriters(t *testing.T, b Backend) {
	db := ordersTable(t, b)
	switch b.Dialect {
	case sqlgen.Postgres:
		exec(t, db, `CREATE TABLE applied (seq bigserial PRIMARY KEY, token bigint NOT NULL)`)
		exec(t, db, `CREATE FUNCTION log_applied() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO applied (token) VALUES (NEW.fence_token); RETURN NEW; END $$`)
		exec(t, db, `CREATE TRIGGER log_applied AFTER INSERT OR UPDATE ON "order items" FOR EACH ROW EXECUTE FUNCTION log_applied()`)
	case sqlgen.SQLite:
		exec(t, db, `CREATE TABLE applied (seq INTEGER PRIMARY KEY AUTOINCREMENT, token INTEGER NOT NULL)`)
		exec(t, db, `CREATE TRIGGER log_insert AFTER INSERT ON "order items" BEGIN INSERT INTO applied (token) VALUES (NEW.fence_token); END`)
		exec(t, db, `CREATE TRIGGER log_update AFTER UPDATE ON "order items" BEGIN INSERT INTO applied (token) VALUES (NEW.fence_token); END`)
	}
	const writers, writes = 6, 25
	var (
		wg              sync.WaitGroup
		mu              sync.Mutex
		maxTried        uint64
		accepted, stale int
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	errs := make(chan error, writers*writes)
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for i := range writes {
				// Rising on the whole, with ties and overtaking among writers.
				token := 1 + 2*uint64(i) + rng.Uint64N(12)
				write := db.Update
				if rng.IntN(2) == 0 {
					write = db.Upsert
				}
				// Row 40 does not exist until an upsert makes it, so early
				// updates may find no row.
				err := write(ctx, set(40, fmt.Sprintf("%d by %d", token, w), token))
				mu.Lock()
				maxTried = max(maxTried, token)
				switch {
				case err == nil:
					accepted++
				case errors.Is(err, fence.ErrStaleToken), errors.Is(err, sqlgen.ErrNoRow):
					stale++
					var st *fence.StaleTokenError
					if errors.As(err, &st) && !(st.Token < st.Highest) {
						errs <- fmt.Errorf("stale error that is not stale: %v", err)
					}
				default:
					errs <- err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("writer: %v", err)
	}
	if t.Failed() {
		return
	}
	var s1, t1, s2, t2 int64
	err := db.QueryRow(ctx, `SELECT a.seq, a.token, b.seq, b.token FROM applied a JOIN applied b ON a.seq < b.seq AND a.token > b.token ORDER BY a.seq, b.seq LIMIT 1`).Scan(&s1, &t1, &s2, &t2)
	if err == nil {
		t.Fatalf("token %d was applied (log %d) after token %d (log %d)", t2, s2, t1, s1)
	}
	var n, maxApplied int64
	if err := db.QueryRow(ctx, `SELECT count(*), max(token) FROM applied`).Scan(&n, &maxApplied); err != nil {
		t.Fatal(err)
	}
	value, token := row(t, b, db, 40)
	t.Logf("%d writes accepted, %d rejected, %d row versions applied; highest token %d", accepted, stale, n, maxTried)
	if n != int64(accepted) || uint64(maxApplied) != maxTried || uint64(token) != maxTried || !strings.HasPrefix(value, fmt.Sprint(maxTried, " by ")) {
		t.Fatalf("row 40 = (%q, token %d); applied %d versions up to token %d; %d writes accepted; highest token tried %d",
			value, token, n, maxApplied, accepted, maxTried)
	}
}

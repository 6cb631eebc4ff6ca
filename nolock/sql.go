package nolock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/fencelock/fence/internal/sqlgen"
)

// Dialect is the SQL dialect of the database: Postgres or SQLite.
type Dialect = sqlgen.Dialect

// The dialects.
const (
	Postgres = sqlgen.Postgres
	SQLite   = sqlgen.SQLite
)

// Column is a column of a row and its value: a key to match, or a value to set.
type Column = sqlgen.Column

// Execer runs statements: a *sql.DB, *sql.Tx or *sql.Conn.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// DB is an Execer that begins transactions: a *sql.DB.
type DB interface {
	Execer
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

var (
	// ErrConflict reports a versioned update of a row whose version was no
	// longer the one read: someone else wrote it first. Read it again and
	// retry (Optimistic does).
	ErrConflict = errors.New("nolock: version conflict")
	// ErrNoRow reports an update of a row that does not exist.
	ErrNoRow = errors.New("nolock: no such row")
	// ErrInsufficient reports a decrement larger than what is left.
	ErrInsufficient = errors.New("nolock: not enough left")
	// ErrInvalid reports a call that cannot be right (no table, no key, a
	// decrement of zero).
	ErrInvalid = errors.New("nolock: invalid argument")
)

// exec runs the statement b built and returns the rows it affected.
func exec(ctx context.Context, db Execer, b *sqlgen.Builder) (int64, error) {
	st := b.Stmt()
	res, err := db.ExecContext(ctx, st.SQL, st.Args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// queryRow runs the statement b built for one row.
func queryRow(ctx context.Context, db Execer, b *sqlgen.Builder) *sql.Row {
	st := b.Stmt()
	return db.QueryRowContext(ctx, st.SQL, st.Args...)
}

func checkRow(table string, key []Column) error {
	if table == "" || len(key) == 0 {
		return fmt.Errorf("%w: a row needs a table and at least one key column", ErrInvalid)
	}
	return nil
}

// exists reports whether the row with key exists.
func exists(ctx context.Context, db Execer, d Dialect, table string, key []Column) (bool, error) {
	b := sqlgen.NewBuilder(d)
	b.Write("SELECT 1 FROM ", sqlgen.Ident(table), " WHERE ")
	b.WhereKey(key)
	var one int
	switch err := queryRow(ctx, db, b).Scan(&one); {
	case errors.Is(err, sql.ErrNoRows):
		return false, nil
	case err != nil:
		return false, err
	}
	return true, nil
}

// VersionedRow is an optimistic update: set columns of the row with Key,
// provided its version column still holds Version, the value read.
type VersionedRow struct {
	Table string
	Key   []Column
	Set   []Column
	// VersionColumn is the version column's name; "version" when empty.
	VersionColumn string
	// Version is the version the caller read.
	Version int64
}

// UpdateVersioned writes the row and raises its version by one, in one
// conditional UPDATE, only if its version is still r.Version, and returns
// the new version. Otherwise nothing is written and it fails with
// ErrConflict (someone wrote first), or ErrNoRow.
func UpdateVersioned(ctx context.Context, db Execer, d Dialect, r VersionedRow) (int64, error) {
	if err := checkRow(r.Table, r.Key); err != nil {
		return 0, err
	}
	version := r.VersionColumn
	if version == "" {
		version = "version"
	}
	v := sqlgen.Ident(version)
	b := sqlgen.NewBuilder(d)
	b.Write("UPDATE ", sqlgen.Ident(r.Table), " SET ")
	for _, c := range r.Set {
		b.Write(sqlgen.Ident(c.Name), " = ", b.Arg(c.Value), ", ")
	}
	b.Write(v, " = ", v, " + 1 WHERE ")
	b.WhereKey(r.Key)
	b.Write(" AND ", v, " = ", b.Arg(r.Version))
	n, err := exec(ctx, db, b)
	if err != nil {
		return 0, err
	}
	if n > 0 {
		return r.Version + 1, nil
	}
	switch ok, err := exists(ctx, db, d, r.Table, r.Key); {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("%w: %s", ErrNoRow, r.Table)
	}
	return 0, fmt.Errorf("%w: %s was written by someone else since version %d was read", ErrConflict, r.Table, r.Version)
}

// Optimistic runs attempt, which should read a row and write it with
// UpdateVersioned, until it succeeds or fails with anything but
// ErrConflict, at most attempts times (10 when 0), with a short random
// pause between tries. It returns attempt's last error.
func Optimistic(ctx context.Context, attempts int, attempt func(ctx context.Context) error) error {
	if attempts <= 0 {
		attempts = 10
	}
	pause := time.Millisecond
	for i := 1; ; i++ {
		err := attempt(ctx)
		if !errors.Is(err, ErrConflict) || i == attempts {
			return err
		}
		t := time.NewTimer(pause/2 + rand.N(pause))
		select {
		case <-ctx.Done():
			t.Stop()
			return errors.Join(err, ctx.Err())
		case <-t.C:
		}
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// Counter is a numeric column of one row: stock, seats, quota.
type Counter struct {
	Table  string
	Key    []Column
	Column string
}

// Decrement takes n from the counter in one conditional UPDATE, only if at
// least n is left, and returns what is left. Otherwise nothing changes and
// it fails with ErrInsufficient (or ErrNoRow). Concurrent decrements never
// take the counter below zero and never lose one another.
func Decrement(ctx context.Context, db Execer, d Dialect, c Counter, n int64) (int64, error) {
	if err := checkRow(c.Table, c.Key); err != nil {
		return 0, err
	}
	if n <= 0 || c.Column == "" {
		return 0, fmt.Errorf("%w: decrement %s of %s by %d: want a column and a positive amount", ErrInvalid, c.Column, c.Table, n)
	}
	col := sqlgen.Ident(c.Column)
	b := sqlgen.NewBuilder(d)
	amount := b.Arg(n)
	b.Write("UPDATE ", sqlgen.Ident(c.Table), " SET ", col, " = ", col, " - ", amount, " WHERE ")
	b.WhereKey(c.Key)
	b.Write(" AND ", col, " >= ", amount, " RETURNING ", col)
	var left int64
	err := queryRow(ctx, db, b).Scan(&left)
	if !errors.Is(err, sql.ErrNoRows) {
		return left, err
	}
	switch ok, err := exists(ctx, db, d, c.Table, c.Key); {
	case err != nil:
		return 0, err
	case !ok:
		return 0, fmt.Errorf("%w: %s", ErrNoRow, c.Table)
	}
	return 0, fmt.Errorf("%w: %s.%s has less than %d", ErrInsufficient, c.Table, c.Column, n)
}

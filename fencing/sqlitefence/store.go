package sqlitefence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/internal/sqlgen"
)

// Querier runs statements. *sql.DB, *sql.Conn and *sql.Tx satisfy it, so
// the row-level helpers run on a database or inside the caller's
// transaction.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// DB is what a Store needs: a Querier that begins transactions. *sql.DB
// and *sql.Conn satisfy it.
type DB interface {
	Querier
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

var (
	_ DB      = (*sql.DB)(nil)
	_ DB      = (*sql.Conn)(nil)
	_ Querier = (*sql.Tx)(nil)
)

// DriverName is the database/sql driver this package uses
// (modernc.org/sqlite).
const DriverName = "sqlite"

// DSN returns the data source name that Open uses for the file at path:
// a file: URI (so any path works) asking for BEGIN IMMEDIATE transactions
// (_txlock=immediate), a 5 s busy timeout and WAL journaling. Use it with
// sql.Open(DriverName, ...) to share the file between a Store and the
// application's own *sql.DB.
func DSN(path string) string {
	// In an SQLite URI, %, ? and # are special in the path; escape them.
	esc := strings.NewReplacer("%", "%25", "?", "%3f", "#", "%23").Replace(filepath.ToSlash(path))
	uri := "file:" + esc
	if strings.HasPrefix(esc, "/") {
		uri = "file://" + esc // an empty authority, so "//x" stays a path
	}
	return uri + "?_txlock=immediate&_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
}

// Store is a fencing.Store in an SQLite table. It is safe for concurrent
// use (when its DB is: *sql.DB is), also by several processes sharing the
// file: SQLite runs one write transaction at a time.
type Store struct {
	db    DB
	close func() error
}

var _ fencing.Store = (*Store)(nil)

// Open opens (or creates) the SQLite file at path with DSN(path) and
// returns a Store on it, creating the table if needed. The Store owns the
// *sql.DB: Close closes it. On error nothing is left open.
func Open(ctx context.Context, path string) (*Store, error) {
	db, err := sql.Open(DriverName, DSN(path))
	if err != nil {
		return nil, fmt.Errorf("sqlitefence: opening %s: %w", path, err)
	}
	s, err := New(ctx, db)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	s.close = db.Close
	return s, nil
}

// New returns a Store on db, creating the table if needed (EnsureSchema).
// The caller keeps db and closes it after the Store: Store.Close does not.
// db should be opened with DSN, or at least with _txlock=immediate and a
// busy timeout; see the package documentation.
func New(ctx context.Context, db DB) (*Store, error) {
	if err := EnsureSchema(ctx, db); err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// EnsureSchema creates the table fence_tokens(key TEXT PRIMARY KEY, token
// INTEGER NOT NULL) unless it exists. It is one statement, idempotent, and
// safe to run from many connections and processes at once.
func EnsureSchema(ctx context.Context, db Querier) error {
	_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS fence_tokens ("key" TEXT PRIMARY KEY, "token" INTEGER NOT NULL)`)
	if err != nil {
		return fmt.Errorf("sqlitefence: creating fence_tokens: %w", err)
	}
	return nil
}

// DB returns the database the Store uses.
func (s *Store) DB() DB { return s.db }

const (
	admitSQL = `INSERT INTO fence_tokens ("key", "token") VALUES (?1, ?2)
ON CONFLICT ("key") DO UPDATE SET "token" = excluded."token" WHERE fence_tokens."token" <= excluded."token"
RETURNING "token"`
	highestSQL = `SELECT "token" FROM fence_tokens WHERE "key" = ?1`
)

// AdmitTx applies the fenced write rule for key and runs write in the same
// transaction, which commits the new highest token and the write together,
// or neither. With DSN's _txlock=immediate the transaction holds SQLite's
// write lock from its start to its end, so Admits run one at a time, in
// any process, waiting up to the busy timeout for each other. A token
// lower than key's highest gets a *fence.StaleTokenError (and write is not
// called); token 0 and tokens above math.MaxInt64 get an error wrapping
// fence.ErrInvalidArgument. An error from write is returned as it is,
// after rolling back. A failed Commit is returned wrapped.
func (s *Store) AdmitTx(ctx context.Context, key string, token uint64, write func(tx *sql.Tx) error) error {
	arg, err := sqlgen.TokenArg(key, token)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlitefence: admitting %s: %w", key, err)
	}
	// A no-op after Commit; on every other path (errors, panics in write)
	// it undoes the token and the write.
	defer tx.Rollback()
	if err := admit(ctx, tx, key, token, arg); err != nil {
		return err
	}
	if err := write(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlitefence: committing the write of %s with token %d: %w", key, token, err)
	}
	return nil
}

// admit raises key's token in tx, or returns why not.
func admit(ctx context.Context, tx *sql.Tx, key string, token uint64, arg int64) error {
	var got int64
	err := tx.QueryRowContext(ctx, admitSQL, key, arg).Scan(&got)
	if err == nil {
		return nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("sqlitefence: admitting %s: %w", key, err)
	}
	var highest int64
	if err := tx.QueryRowContext(ctx, highestSQL, key).Scan(&highest); err != nil {
		return fmt.Errorf("sqlitefence: reading the token of %s: %w", key, err)
	}
	if err := fence.CheckToken(key, token, uint64(highest)); err != nil {
		return err
	}
	return fmt.Errorf("sqlitefence: admitting %s: the upsert refused token %d though the highest is %d", key, token, highest)
}

// Admit implements fencing.Store, as AdmitTx: write runs inside the
// transaction, which it reaches with Tx(ctx), so its statements commit or
// roll back with the token.
func (s *Store) Admit(ctx context.Context, key string, token uint64, write func(ctx context.Context) error) error {
	return s.AdmitTx(ctx, key, token, func(tx *sql.Tx) error {
		return write(context.WithValue(ctx, txKey{}, tx))
	})
}

type txKey struct{}

// Tx returns the transaction of the Admit whose write was given ctx, or nil
// outside one. It is valid only until that write returns.
func Tx(ctx context.Context) *sql.Tx {
	tx, _ := ctx.Value(txKey{}).(*sql.Tx)
	return tx
}

// Highest implements fencing.Store: the highest token admitted for key, 0
// if none, as of the last commit.
func (s *Store) Highest(ctx context.Context, key string) (uint64, error) {
	var highest int64
	err := s.db.QueryRowContext(ctx, highestSQL, key).Scan(&highest)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("sqlitefence: reading the token of %s: %w", key, err)
	}
	return uint64(highest), nil
}

// Close closes the database if Open opened it; a Store from New leaves its
// DB to the caller. Call it after the Admits in flight have returned.
func (s *Store) Close() error {
	if s.close != nil {
		return s.close()
	}
	return nil
}

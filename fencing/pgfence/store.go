package pgfence

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/internal/sqlgen"
)

// Querier runs statements. *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it,
// so the row-level helpers run on a pool, a connection, or inside the
// caller's transaction.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DB is what a Store needs: a Querier that begins transactions.
// *pgxpool.Pool and *pgx.Conn satisfy it. A *pgx.Conn is not safe for
// concurrent use, and so neither is a Store on one; use a pool to share a
// Store between goroutines.
type DB interface {
	Querier
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

var (
	_ DB      = (*pgxpool.Pool)(nil)
	_ DB      = (*pgx.Conn)(nil)
	_ Querier = (pgx.Tx)(nil)
)

// Store is a fencing.Store on the PostgreSQL table fence_tokens. It is safe
// for concurrent use when its DB is (a pool is), also from many processes
// sharing the database: writers of one key serialize on its row lock.
type Store struct {
	db    DB
	close func()
}

var _ fencing.Store = (*Store)(nil)

// Open connects a pool to dsn (see pgxpool.ParseConfig) and returns a Store
// on it, creating the table if needed. The Store owns the pool: Close
// closes it. On error nothing is left open.
func Open(ctx context.Context, dsn string) (*Store, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("pgfence: %w", err)
	}
	s, err := New(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.close = pool.Close
	return s, nil
}

// New returns a Store on db, creating the table if needed (EnsureSchema).
// The caller keeps db, and closes it after the Store: Store.Close does not.
func New(ctx context.Context, db DB) (*Store, error) {
	if err := EnsureSchema(ctx, db); err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// schemaLock is the transaction-level advisory lock EnsureSchema takes, so
// that concurrent CREATE TABLE IF NOT EXISTS do not race in the catalog.
const schemaLock int64 = 0x66656e6365746b6e // "fencetkn"

const createTable = `CREATE TABLE IF NOT EXISTS fence_tokens (key text PRIMARY KEY, token bigint NOT NULL)`

// EnsureSchema creates the table fence_tokens(key text primary key, token
// bigint not null) in the first schema of db's search_path, unless it
// exists. It is idempotent and safe to run from many processes at once
// (they serialize on an advisory lock).
func EnsureSchema(ctx context.Context, db DB) error {
	tx, err := db.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("pgfence: creating fence_tokens: %w", err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, schemaLock); err != nil {
		return fmt.Errorf("pgfence: creating fence_tokens: %w", err)
	}
	if _, err := tx.Exec(ctx, createTable); err != nil {
		return fmt.Errorf("pgfence: creating fence_tokens: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgfence: creating fence_tokens: %w", err)
	}
	return nil
}

// DB returns the database the Store uses.
func (s *Store) DB() DB { return s.db }

// The upsert of Admit. ON CONFLICT DO UPDATE locks the key's row even when
// the WHERE is false, so the transaction holds the row lock either way, and
// a concurrent Admit of the key waits until this one commits or rolls back.
const (
	admitSQL = `INSERT INTO fence_tokens AS f (key, token) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token WHERE f.token <= EXCLUDED.token
RETURNING f.token`
	highestSQL = `SELECT token FROM fence_tokens WHERE key = $1`
)

// AdmitTx applies the fenced write rule for key and runs write in the same
// READ COMMITTED transaction, which commits the new highest token and the
// write together, or neither. The transaction holds key's row lock from the
// check to the commit, so Admits of one key run one at a time, in any
// process. A token lower than key's highest gets a *fence.StaleTokenError
// (and write is not called); token 0 and tokens above math.MaxInt64 get an
// error wrapping fence.ErrInvalidArgument. An error from write is returned
// as it is, after rolling back. If Commit itself fails the error is
// returned; as with any commit whose connection is lost, the outcome may
// then be unknown.
func (s *Store) AdmitTx(ctx context.Context, key string, token uint64, write func(tx pgx.Tx) error) error {
	arg, err := sqlgen.TokenArg(key, token)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return fmt.Errorf("pgfence: admitting %s: %w", key, err)
	}
	// A no-op after Commit; on every other path (errors, panics in write)
	// it undoes the token and the write. If ctx is done, pgx closes the
	// connection instead, which rolls back just the same.
	defer tx.Rollback(ctx)
	if err := admitLocked(ctx, tx, key, token, arg); err != nil {
		return err
	}
	if err := write(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("pgfence: committing the write of %s with token %d: %w", key, token, err)
	}
	return nil
}

// admitLocked raises key's token in tx, or returns why not. Either way tx
// holds the row lock of key afterwards (or has failed).
func admitLocked(ctx context.Context, tx pgx.Tx, key string, token uint64, arg int64) error {
	var got int64
	err := tx.QueryRow(ctx, admitSQL, key, arg).Scan(&got)
	if err == nil {
		return nil
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("pgfence: admitting %s: %w", key, err)
	}
	var highest int64
	if err := tx.QueryRow(ctx, highestSQL, key).Scan(&highest); err != nil {
		return fmt.Errorf("pgfence: reading the token of %s: %w", key, err)
	}
	if err := fence.CheckToken(key, token, uint64(highest)); err != nil {
		return err
	}
	return fmt.Errorf("pgfence: admitting %s: the upsert refused token %d though the highest is %d", key, token, highest)
}

// Admit implements fencing.Store, as AdmitTx: write runs inside the
// transaction, which it reaches with Tx(ctx), so its statements commit or
// roll back with the token.
func (s *Store) Admit(ctx context.Context, key string, token uint64, write func(ctx context.Context) error) error {
	return s.AdmitTx(ctx, key, token, func(tx pgx.Tx) error {
		return write(context.WithValue(ctx, txKey{}, tx))
	})
}

type txKey struct{}

// Tx returns the transaction of the Admit whose write was given ctx, or nil
// outside one. It is valid only until that write returns.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

// Highest implements fencing.Store: the highest token admitted for key, 0
// if none, as of one committed snapshot.
func (s *Store) Highest(ctx context.Context, key string) (uint64, error) {
	var highest int64
	err := s.db.QueryRow(ctx, highestSQL, key).Scan(&highest)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("pgfence: reading the token of %s: %w", key, err)
	}
	return uint64(highest), nil
}

// Close closes the pool if Open made it; a Store from New leaves its DB to
// the caller. It does not wait for Admits in flight; call it after them.
func (s *Store) Close() error {
	if s.close != nil {
		s.close()
	}
	return nil
}

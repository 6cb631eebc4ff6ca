package check

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fencelock/fence/fencing/pgfence"
)

// The SQL side of a run: a counter row per run in PostgreSQL, incremented
// by one atomic UPDATE inside pgfence's fenced transaction, so that the
// token check and the increment commit together.
const sqlTable = "fence_check_counter"

type sqlCounter struct {
	pool   *pgxpool.Pool
	prefix string
}

// openSQLCounter creates the run's counter row.
func openSQLCounter(ctx context.Context, dsn, prefix string) (*sqlCounter, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+sqlTable+` (name text PRIMARY KEY, value bigint NOT NULL)`)
	if err == nil {
		_, err = pool.Exec(ctx, `INSERT INTO `+sqlTable+` (name, value) VALUES ($1, 0) ON CONFLICT (name) DO NOTHING`, prefix)
	}
	if err == nil {
		_, err = pgfence.New(ctx, pool) // creates the tokens table before the workers race to
	}
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("preparing the SQL counter: %w", err)
	}
	return &sqlCounter{pool: pool, prefix: prefix}, nil
}

func (s *sqlCounter) value(ctx context.Context) (int64, error) {
	var v int64
	err := s.pool.QueryRow(ctx, `SELECT value FROM `+sqlTable+` WHERE name = $1`, s.prefix).Scan(&v)
	return v, err
}

func (s *sqlCounter) Close() error {
	s.pool.Close()
	return nil
}

type sqlTarget struct {
	sqlCounter
	store *pgfence.Store
}

// OpenSQLTarget opens the fenced SQL counter for a worker.
func OpenSQLTarget(ctx context.Context, dsn, prefix string) (SQLTarget, error) {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("connecting to PostgreSQL: %w", err)
	}
	store, err := pgfence.New(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return &sqlTarget{sqlCounter: sqlCounter{pool: pool, prefix: prefix}, store: store}, nil
}

// Increment adds one to the run's counter: with fencing, inside AdmitTx,
// so that a stale token commits nothing; unsafe, as a bare UPDATE.
func (t *sqlTarget) Increment(ctx context.Context, token uint64, unsafe bool) error {
	const incr = `UPDATE ` + sqlTable + ` SET value = value + 1 WHERE name = $1`
	if unsafe {
		_, err := t.pool.Exec(ctx, incr, t.prefix)
		return err
	}
	return t.store.AdmitTx(ctx, "check/"+t.prefix, token, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, incr, t.prefix)
		return err
	})
}

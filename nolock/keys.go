package nolock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/fencelock/fence/internal/sqlgen"
)

// CreateKeyTable creates, if it does not exist, a table of job or
// idempotency keys for Once and Idempotent: the key, the stored result
// and when it was recorded.
func CreateKeyTable(ctx context.Context, db Execer, d Dialect, table string) error {
	blob, now := "BYTEA", "TIMESTAMPTZ NOT NULL DEFAULT now()"
	if d == SQLite {
		blob, now = "BLOB", "TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP"
	}
	_, err := db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS "+sqlgen.Ident(table)+
		" (key TEXT PRIMARY KEY, result "+blob+", recorded_at "+now+")")
	return err
}

// Once runs job at most once for key, ever: in one transaction it records
// key in table (made by CreateKeyTable) and runs job, so the job's own
// writes in tx commit together with the key, or not at all. If the key is
// already recorded it returns false without running job; a concurrent call
// with the same key waits for the first to commit or roll back. If job
// fails, nothing is recorded and a later call runs it again.
//
// Only the job's writes through tx are covered: a side effect outside the
// database (an email) can still happen twice if the process dies between
// it and the commit.
func Once(ctx context.Context, db DB, d Dialect, table, key string, job func(ctx context.Context, tx *sql.Tx) error) (ran bool, err error) {
	_, replayed, err := Idempotent(ctx, db, d, table, key, func(ctx context.Context, tx *sql.Tx) ([]byte, error) {
		return nil, job(ctx, tx)
	})
	return err == nil && !replayed, err
}

// Idempotent runs fn once for key and stores its result in table (made by
// CreateKeyTable), in fn's transaction; a later call with the same key
// returns the stored result, with replayed true, without running fn. A
// concurrent call with the same key waits for the first to commit, then
// returns its result. If fn fails, nothing is recorded.
func Idempotent(ctx context.Context, db DB, d Dialect, table, key string, fn func(ctx context.Context, tx *sql.Tx) ([]byte, error)) (result []byte, replayed bool, err error) {
	if table == "" || key == "" {
		return nil, false, fmt.Errorf("%w: an idempotency key needs a table and a key", ErrInvalid)
	}
	t := sqlgen.Ident(table)
	p1, p2 := d.Placeholder(1), d.Placeholder(2)
	// A key claimed by a call that then rolled back is free again, so a
	// call that finds the key taken, then gone, tries again.
	for range 3 {
		// In READ COMMITTED a racing insert waits for the first claimant
		// and then sees its row; stricter levels would fail it instead.
		var opts *sql.TxOptions
		if d == Postgres {
			opts = &sql.TxOptions{Isolation: sql.LevelReadCommitted}
		}
		tx, err := db.BeginTx(ctx, opts)
		if err != nil {
			return nil, false, err
		}
		// The insert waits for a concurrent claimant of key to finish.
		res, err := tx.ExecContext(ctx, "INSERT INTO "+t+" (key) VALUES ("+p1+") ON CONFLICT (key) DO NOTHING", key)
		var n int64
		if err == nil {
			n, err = res.RowsAffected()
		}
		if err != nil {
			return nil, false, errors.Join(err, tx.Rollback())
		}
		if n == 1 {
			result, err := fn(ctx, tx)
			if err == nil {
				_, err = tx.ExecContext(ctx, "UPDATE "+t+" SET result = "+p1+" WHERE key = "+p2, result, key)
			}
			if err == nil {
				err = tx.Commit()
			}
			if err != nil {
				return nil, false, errors.Join(err, tx.Rollback())
			}
			return result, false, nil
		}
		if err := tx.Rollback(); err != nil {
			return nil, false, err
		}
		switch err := db.QueryRowContext(ctx, "SELECT result FROM "+t+" WHERE key = "+p1, key).Scan(&result); {
		case err == nil:
			return result, true, nil
		case !errors.Is(err, sql.ErrNoRows):
			return nil, false, err
		}
	}
	return nil, false, fmt.Errorf("nolock: key %q of %s was claimed and released three times in a row; try again", key, table)
}

// Forget deletes key from table, so that Once or Idempotent run again for
// it. Idempotency keys are usually forgotten after a day or so; job keys
// usually never.
func Forget(ctx context.Context, db Execer, d Dialect, table, key string) error {
	_, err := db.ExecContext(ctx, "DELETE FROM "+sqlgen.Ident(table)+" WHERE key = "+d.Placeholder(1), key)
	return err
}

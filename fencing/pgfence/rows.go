package pgfence

import (
	"context"
	"fmt"

	"github.com/fencelock/fence/internal/sqlgen"
)

// ErrNoRow reports an Update of a row that does not exist: nothing was
// written. It is the same value as sqlitefence.ErrNoRow.
var ErrNoRow = sqlgen.ErrNoRow

// DefaultTokenColumn is the token column's name when none is given.
const DefaultTokenColumn = sqlgen.DefaultTokenColumn

// Column is a column's name, used exactly as given (it is always quoted),
// and a value to compare it with or write to it.
type Column = sqlgen.Column

// UpdateRow is one fenced update of an existing row: Table, Set, Where
// (the row's key columns), Token and TokenColumn.
type UpdateRow = sqlgen.UpdateRow

// UpsertRow is one fenced insert-or-update of a row: Table, Key (with a
// unique index or constraint, the ON CONFLICT target), Set, Token and
// TokenColumn.
type UpsertRow = sqlgen.UpsertRow

// Update writes u.Set and the token into the row u.Where identifies, in one
// statement, atomic on its own (db may be a pool, a connection or the
// caller's transaction), and only if the row's token is not higher than
// u.Token:
//
//	UPDATE t SET ..., token_col = $n WHERE <where> AND token_col <= $n
//
// When it writes nothing it reads the row's token and returns a
// *fence.StaleTokenError naming both tokens and the key "table/values"
// (as in "stale fencing token 33 < 34 for key orders/17"), or an error
// wrapping ErrNoRow if the row does not exist. Bad arguments (no table,
// no Where, token 0 or above math.MaxInt64) wrap fence.ErrInvalidArgument
// and run nothing; database errors are returned wrapped.
func Update(ctx context.Context, db Querier, u UpdateRow) error {
	return sqlgen.Fenced(ctx, "pgfence", sqlgen.Postgres, executor{db}, sqlgen.Update, u.Row())
}

// Upsert inserts the row (u.Key, u.Set and the token), or, if a row with
// that key exists, updates it only if its token is not higher than
// u.Token, in one statement, atomic on its own:
//
//	INSERT ... ON CONFLICT (keys) DO UPDATE SET ... WHERE t.token_col <= EXCLUDED.token_col
//
// When it writes nothing it returns a *fence.StaleTokenError naming both
// tokens. Errors as for Update; Upsert never returns ErrNoRow.
func Upsert(ctx context.Context, db Querier, u UpsertRow) error {
	return sqlgen.Fenced(ctx, "pgfence", sqlgen.Postgres, executor{db}, sqlgen.Upsert, u.Row())
}

// AddTokenColumn adds the token column (bigint NOT NULL DEFAULT 0, named
// DefaultTokenColumn if column is empty) to an existing table, unless it
// has it:
//
//	ALTER TABLE t ADD COLUMN IF NOT EXISTS column bigint NOT NULL DEFAULT 0
//
// Existing rows get token 0, which every token admits. It is one statement
// (atomic, and it waits for the table's ACCESS EXCLUSIVE lock), idempotent,
// and safe to run concurrently. An existing column of that name is left as
// it is, whatever its type.
func AddTokenColumn(ctx context.Context, db Querier, table, column string) error {
	if _, err := db.Exec(ctx, sqlgen.AddColumnSQL(sqlgen.Postgres, table, column)); err != nil {
		return fmt.Errorf("pgfence: adding the token column to %s: %w", table, err)
	}
	return nil
}

// executor runs sqlgen's statements through a Querier.
type executor struct{ db Querier }

func (e executor) Exec(ctx context.Context, s sqlgen.Stmt) (int64, error) {
	tag, err := e.db.Exec(ctx, s.SQL, s.Args...)
	return tag.RowsAffected(), err
}

func (e executor) Lookup(ctx context.Context, s sqlgen.Stmt) (rows, highest int64, err error) {
	err = e.db.QueryRow(ctx, s.SQL, s.Args...).Scan(&rows, &highest)
	return rows, highest, err
}

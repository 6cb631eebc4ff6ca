package sqlgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/fencelock/fence"
)

// ErrNoRow reports a fenced update of a row that does not exist: nothing
// was written. pgfence and sqlitefence export it as their ErrNoRow.
var ErrNoRow = errors.New("fencing: no such row")

// DefaultTokenColumn is the token column's name when none is given.
const DefaultTokenColumn = "fence_token"

// Dialect is the SQL dialect a statement is built for.
type Dialect int

const (
	// Postgres numbers parameters $1, $2...
	Postgres Dialect = iota + 1
	// SQLite numbers parameters ?1, ?2...
	SQLite
)

// String returns the dialect's name.
func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "PostgreSQL"
	case SQLite:
		return "SQLite"
	}
	return "Dialect(" + strconv.Itoa(int(d)) + ")"
}

// Placeholder returns the n-th (from 1) parameter's placeholder. A
// placeholder may appear more than once in a statement; each refers to the
// same argument. It panics on an unknown dialect, a programming error.
func (d Dialect) Placeholder(n int) string {
	switch d {
	case Postgres:
		return "$" + strconv.Itoa(n)
	case SQLite:
		return "?" + strconv.Itoa(n)
	}
	panic("sqlgen: unknown dialect " + d.String())
}

// Ident quotes name as an SQL identifier in both dialects: double quotes
// around it, and every double quote inside doubled. It accepts any name
// (the database says whether it exists) and the result can never close the
// identifier early, whatever name holds.
func Ident(name string) string {
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
}

// Column is one column of a row, with the value to compare or write.
type Column struct {
	Name  string
	Value any
}

// Stmt is a statement with its arguments, numbered from 1 in Args order.
type Stmt struct {
	SQL  string
	Args []any
}

// Row is one fenced write of a row.
type Row struct {
	// Table is the table's name, one identifier.
	Table string
	// Key identifies the row: the WHERE of an update (column = value, all
	// of them), the conflict target of an upsert.
	Key []Column
	// Set are the columns the write sets.
	Set []Column
	// TokenColumn is the column holding the row's highest token;
	// DefaultTokenColumn if empty.
	TokenColumn string
	// Token is the write's fencing token.
	Token uint64
}

// UpdateRow is one fenced update of an existing row; pgfence and
// sqlitefence export it as their UpdateRow.
type UpdateRow struct {
	// Table is the table's name, one identifier (in PostgreSQL, found
	// through the search_path).
	Table string
	// Set are the columns to write.
	Set []Column
	// Where identifies the row: each column equals its value. It should
	// name a unique key; if it matches several rows, each is fenced on its
	// own token.
	Where []Column
	// Token is the write's fencing token, at least 1.
	Token uint64
	// TokenColumn holds the row's token; DefaultTokenColumn if empty.
	TokenColumn string
}

// Row is the update as a Row.
func (u UpdateRow) Row() Row {
	return Row{Table: u.Table, Key: u.Where, Set: u.Set, TokenColumn: u.TokenColumn, Token: u.Token}
}

// UpsertRow is one fenced insert-or-update of a row; pgfence and
// sqlitefence export it as their UpsertRow.
type UpsertRow struct {
	// Table is the table's name, one identifier (in PostgreSQL, found
	// through the search_path).
	Table string
	// Key identifies the row; its columns need a unique index or
	// constraint (the ON CONFLICT target).
	Key []Column
	// Set are the other columns to write.
	Set []Column
	// Token is the write's fencing token, at least 1.
	Token uint64
	// TokenColumn holds the row's token; DefaultTokenColumn if empty.
	TokenColumn string
}

// Row is the upsert as a Row.
func (u UpsertRow) Row() Row {
	return Row{Table: u.Table, Key: u.Key, Set: u.Set, TokenColumn: u.TokenColumn, Token: u.Token}
}

func (r Row) tokenColumn() string {
	if r.TokenColumn == "" {
		return DefaultTokenColumn
	}
	return r.TokenColumn
}

// KeyString names the row for errors: the table and the key's values,
// separated by slashes, as in "orders/17".
func (r Row) KeyString() string {
	var b strings.Builder
	b.WriteString(r.Table)
	for _, c := range r.Key {
		b.WriteByte('/')
		fmt.Fprint(&b, c.Value)
	}
	return b.String()
}

// Op is the kind of a fenced write.
type Op int

const (
	// Update writes an existing row only.
	Update Op = iota + 1
	// Upsert inserts the row or updates the existing one.
	Upsert
)

// String returns "update" or "upsert".
func (o Op) String() string {
	switch o {
	case Update:
		return "update"
	case Upsert:
		return "upsert"
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// TokenArg returns token as the int64 that SQL stores, or an error wrapping
// fence.ErrInvalidArgument for 0 and for tokens above math.MaxInt64 (SQL
// integers are signed 64-bit; fence issues those only after 2^63 grants).
func TokenArg(key string, token uint64) (int64, error) {
	if err := fence.CheckToken(key, token, 0); err != nil {
		return 0, err
	}
	if token > math.MaxInt64 {
		return 0, fmt.Errorf("%w: fencing token %d of %s is above %d, the largest an SQL bigint holds",
			fence.ErrInvalidArgument, token, key, int64(math.MaxInt64))
	}
	return int64(token), nil
}

// Validate checks r for op: a table, at least one key column, a name for
// every column, and a token TokenArg accepts. Errors wrap
// fence.ErrInvalidArgument.
func (r Row) Validate(op Op) (int64, error) {
	keyField := "Where"
	if op == Upsert {
		keyField = "Key"
	}
	if r.Table == "" {
		return 0, fmt.Errorf("%w: fenced %s: no Table given", fence.ErrInvalidArgument, op)
	}
	if len(r.Key) == 0 {
		return 0, fmt.Errorf("%w: fenced %s of %s: no %s columns given; the row must be identified",
			fence.ErrInvalidArgument, op, r.Table, keyField)
	}
	for _, cols := range [][]Column{r.Key, r.Set} {
		for i, c := range cols {
			if c.Name == "" {
				return 0, fmt.Errorf("%w: fenced %s of %s: column %d has no name", fence.ErrInvalidArgument, op, r.Table, i)
			}
		}
	}
	return TokenArg(r.KeyString(), r.Token)
}

// Builder builds one statement with numbered parameters.
type Builder struct {
	d    Dialect
	sql  strings.Builder
	args []any
}

// NewBuilder returns a Builder of a statement in dialect d.
func NewBuilder(d Dialect) *Builder { return &Builder{d: d} }

// Write appends SQL text.
func (b *Builder) Write(parts ...string) {
	for _, p := range parts {
		b.sql.WriteString(p)
	}
}

// Arg adds an argument and returns its placeholder.
func (b *Builder) Arg(v any) string {
	b.args = append(b.args, v)
	return b.d.Placeholder(len(b.args))
}

// Stmt returns the statement built.
func (b *Builder) Stmt() Stmt { return Stmt{SQL: b.sql.String(), Args: b.args} }

// WhereKey writes "a" = $i AND "b" = $j ... for the key columns.
func (b *Builder) WhereKey(key []Column) {
	for i, c := range key {
		if i > 0 {
			b.Write(" AND ")
		}
		b.Write(Ident(c.Name), " = ", b.Arg(c.Value))
	}
}

// UpdateStmt builds the one statement of a fenced update:
//
//	UPDATE "t" SET "a" = $1, "tok" = $3 WHERE "id" = $2 AND "tok" <= $3
//
// It writes the row only if its token is not higher than token.
func UpdateStmt(d Dialect, r Row, token int64) Stmt {
	b := NewBuilder(d)
	tok := Ident(r.tokenColumn())
	b.Write("UPDATE ", Ident(r.Table), " SET ")
	for _, c := range r.Set {
		b.Write(Ident(c.Name), " = ", b.Arg(c.Value), ", ")
	}
	// The token's placeholder comes after the key's, but is written first.
	tokenArg := d.Placeholder(len(r.Set) + len(r.Key) + 1)
	b.Write(tok, " = ", tokenArg, " WHERE ")
	b.WhereKey(r.Key)
	b.args = append(b.args, token)
	b.Write(" AND ", tok, " <= ", tokenArg)
	return b.Stmt()
}

// UpsertStmt builds the one statement of a fenced upsert:
//
//	INSERT INTO "t" ("id", "a", "tok") VALUES ($1, $2, $3)
//	ON CONFLICT ("id") DO UPDATE SET "a" = EXCLUDED."a", "tok" = EXCLUDED."tok"
//	WHERE "t"."tok" <= EXCLUDED."tok"
//
// It inserts the row, or updates it only if its token is not higher than
// token. The key columns need a unique index or constraint.
func UpsertStmt(d Dialect, r Row, token int64) Stmt {
	b := NewBuilder(d)
	table, tok := Ident(r.Table), Ident(r.tokenColumn())
	var names, values, keys, sets []string
	for _, c := range r.Key {
		names = append(names, Ident(c.Name))
		values = append(values, b.Arg(c.Value))
		keys = append(keys, Ident(c.Name))
	}
	for _, c := range r.Set {
		names = append(names, Ident(c.Name))
		values = append(values, b.Arg(c.Value))
		sets = append(sets, Ident(c.Name)+" = EXCLUDED."+Ident(c.Name))
	}
	names = append(names, tok)
	values = append(values, b.Arg(token))
	sets = append(sets, tok+" = EXCLUDED."+tok)
	b.Write("INSERT INTO ", table, " (", strings.Join(names, ", "), ") VALUES (", strings.Join(values, ", "), ")",
		" ON CONFLICT (", strings.Join(keys, ", "), ") DO UPDATE SET ", strings.Join(sets, ", "),
		" WHERE ", table, ".", tok, " <= EXCLUDED.", tok)
	return b.Stmt()
}

// LookupStmt builds the look-up that explains a fenced write that wrote
// nothing: the number of rows with r's key, and the highest token among
// them (0 if none).
//
//	SELECT count(*), coalesce(max("tok"), 0) FROM "t" WHERE "id" = $1
func LookupStmt(d Dialect, r Row) Stmt {
	b := NewBuilder(d)
	b.Write("SELECT count(*), coalesce(max(", Ident(r.tokenColumn()), "), 0) FROM ", Ident(r.Table), " WHERE ")
	b.WhereKey(r.Key)
	return b.Stmt()
}

// AddColumnSQL returns the statement that adds a token column (bigint, not
// null, default 0) to table. For PostgreSQL it carries IF NOT EXISTS;
// SQLite has none, and its caller checks the column first. An empty column
// is DefaultTokenColumn.
func AddColumnSQL(d Dialect, table, column string) string {
	if column == "" {
		column = DefaultTokenColumn
	}
	switch d {
	case Postgres:
		return "ALTER TABLE " + Ident(table) + " ADD COLUMN IF NOT EXISTS " + Ident(column) + " bigint NOT NULL DEFAULT 0"
	case SQLite:
		return "ALTER TABLE " + Ident(table) + " ADD COLUMN " + Ident(column) + " INTEGER NOT NULL DEFAULT 0"
	}
	panic("sqlgen: unknown dialect " + d.String())
}

// Executor runs the statements of Fenced on one database handle.
type Executor interface {
	// Exec runs s and returns how many rows it wrote.
	Exec(ctx context.Context, s Stmt) (int64, error)
	// Lookup runs a LookupStmt: the number of rows and their highest token.
	Lookup(ctx context.Context, s Stmt) (rows, highest int64, err error)
}

// maxAttempts bounds the retries of a write whose row changed between the
// write and the look-up that was to explain why it wrote nothing.
const maxAttempts = 10

// Fenced runs the fenced write op of r: one conditional statement, atomic
// on its own. When it writes nothing, it reads the row's token and returns
// a *fence.StaleTokenError naming both tokens, or, for an update of a row
// that does not exist, an error wrapping ErrNoRow. If the look-up finds
// that the write should have been admitted (the row appeared, or was
// deleted, in between) the write is tried again, a few times. Other errors
// are prefixed with pkg ("pgfence") and wrap the database's error.
func Fenced(ctx context.Context, pkg string, d Dialect, ex Executor, op Op, r Row) error {
	token, err := r.Validate(op)
	if err != nil {
		return fmt.Errorf("%s: %w", pkg, err)
	}
	write := UpsertStmt(d, r, token)
	if op == Update {
		write = UpdateStmt(d, r, token)
	}
	lookup, key := LookupStmt(d, r), r.KeyString()
	for range maxAttempts {
		n, err := ex.Exec(ctx, write)
		if err != nil {
			return fmt.Errorf("%s: fenced %s of %s: %w", pkg, op, key, err)
		}
		if n > 0 {
			return nil
		}
		rows, highest, err := ex.Lookup(ctx, lookup)
		if err != nil {
			return fmt.Errorf("%s: fenced %s of %s wrote nothing, and reading its token failed: %w", pkg, op, key, err)
		}
		if rows == 0 && op == Update {
			return fmt.Errorf("%s: fenced update of %s: %w", pkg, key, ErrNoRow)
		}
		if rows > 0 && highest > token {
			return &fence.StaleTokenError{Key: key, Token: r.Token, Highest: uint64(highest)}
		}
		// The row changed in between (inserted, deleted, or its token
		// lowered by a write that bypassed the fence): try again.
	}
	return fmt.Errorf("%s: fenced %s of %s wrote nothing %d times although the row's token was not higher than %d each time it was read (is the token column %s NULL?)",
		pkg, op, key, maxAttempts, r.Token, r.tokenColumn())
}

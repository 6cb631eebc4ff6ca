// Package sqlgen builds the SQL statements of the row-level fencing helpers
// of pgfence and sqlitefence, and runs the shared part of their logic, so
// that both dialects quote, number and report alike.
//
// # Identifiers
//
// Ident quotes every identifier, whatever it holds: it wraps the name in
// double quotes and doubles the double quotes inside, so a table named
// `order items` or a column named `select` works, and no name can end the
// identifier early. Names are therefore used exactly as given: in
// PostgreSQL, an unquoted name created as Orders is stored as orders, and
// must be passed as "orders".
//
// # Placeholders
//
// PostgreSQL numbers its parameters $1, $2...; SQLite takes ?1, ?2..., so a
// parameter may be used twice in one statement in both:
//
//	sqlgen.Postgres.Placeholder(3) // "$3"
//	sqlgen.SQLite.Placeholder(3)   // "?3"
//
// # Fenced writes
//
// UpdateStmt and UpsertStmt build one conditional statement that writes the
// row only if its token is not higher than the write's; Fenced runs it and,
// when nothing was written, reads the row's token to report a
// *fence.StaleTokenError, or ErrNoRow.
//
// # Its place
//
// sqlgen stands on the ground floor, under pgfence, sqlitefence and
// nolock, and imports only package fence: the resource side stays free of
// the client, raft and Connect. Its conformance suite on real databases is
// internal/testutil/rowtest.
package sqlgen

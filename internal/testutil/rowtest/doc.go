// Package rowtest is the conformance suite of the row-level fencing helpers
// (Update, Upsert, AddTokenColumn) that pgfence and sqlitefence run on a
// real database each: stale writes rejected with both tokens and the row
// unchanged, equal tokens accepted, missing rows, bad arguments, names that
// need quoting, the token column added to a table that has rows, and
// concurrent writers with random tokens.
//
// A package adapts its handle to DB and runs the suite on fresh databases:
//
//	func TestRows(t *testing.T) {
//		rowtest.Run(t, rowtest.Backend{
//			Dialect: sqlgen.SQLite,
//			New: func(t *testing.T) rowtest.DB {
//				return liteDB{openTempDB(t)}
//			},
//		})
//	}
//
// It is test scaffolding (internal/testutil/): only the tests of pgfence and
// sqlitefence import it.
package rowtest

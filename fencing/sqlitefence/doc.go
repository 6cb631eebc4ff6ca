// Package sqlitefence applies the fenced write rule in SQLite, through
// database/sql and the pure-Go driver modernc.org/sqlite: a fencing.Store
// whose tokens live in a table, and row-level fencing for existing tables,
// where each row carries the highest token that wrote it.
//
// # Store
//
// Store keeps the highest token of each key in the table
//
//	fence_tokens(key TEXT PRIMARY KEY, token INTEGER NOT NULL)
//
// Admit and AdmitTx run the check and the caller's write in one
// transaction: an upsert that raises the token only if it is not lower,
// then the write, then commit; a stale token gets a *fence.StaleTokenError
// and the write is not run; any failure rolls back the token and the write
// together.
//
//	store, err := sqlitefence.Open(ctx, "/var/lib/app/data.db")
//	err = store.AdmitTx(ctx, "orders/17", token, func(tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = 17`)
//		return err
//	})
//	if errors.Is(err, fence.ErrStaleToken) {
//		// a newer holder has written: nothing of ours was applied
//	}
//
// # Sharing a file
//
// One SQLite file may be shared by many connections and many processes on
// one machine: SQLite has one writer at a time, and the transactions of
// this package take the write lock when they begin (BEGIN IMMEDIATE), so
// concurrent Admits wait for each other instead of failing with
// SQLITE_BUSY, for up to the busy timeout (5 s). Open and DSN set this up:
// the DSN asks modernc.org/sqlite for _txlock=immediate,
// busy_timeout(5000) and WAL journaling. A *sql.DB opened otherwise and
// given to New works too, but without _txlock=immediate concurrent writers
// may get SQLITE_BUSY. WAL needs the processes on one host; do not put the
// file on a network file system.
//
// # Row-level fencing
//
// A table gets a token column with AddTokenColumn (INTEGER NOT NULL
// DEFAULT 0, "fence_token" by default). Update and Upsert then write a row
// in one conditional statement, atomic without a transaction, that applies
// only if the row's token is not higher than the write's, and set the token
// (SQLite 3.35 or later, for UPSERT ... WHERE and RETURNING; the driver
// embeds a newer one):
//
//	err := sqlitefence.AddTokenColumn(ctx, db, "orders", "")
//	err = sqlitefence.Update(ctx, db, sqlitefence.UpdateRow{
//		Table: "orders",
//		Set:   []sqlitefence.Column{{Name: "status", Value: "paid"}},
//		Where: []sqlitefence.Column{{Name: "id", Value: 17}},
//		Token: token,
//	})
//	// stale: "stale fencing token 33 < 34 for key orders/17"
//
// Table and column names are quoted, always: any name works ("order items",
// "select").
//
// # Caveats
//
// Tokens are stored as 64-bit signed integers: tokens above math.MaxInt64
// are refused with fence.ErrInvalidArgument. Only writes that go through
// the fence are fenced: a plain UPDATE of the same rows bypasses it.
package sqlitefence

// Package pgfence applies the fenced write rule in PostgreSQL, through pgx:
// a fencing.Store whose tokens live in a table, and row-level fencing for
// existing tables, where each row carries the highest token that wrote it.
//
// # Store
//
// Store keeps the highest token of each key in the table
//
//	fence_tokens(key text PRIMARY KEY, token bigint NOT NULL)
//
// (in the first schema of the connection's search_path). Admit and AdmitTx
// run the check and the caller's write in one transaction: an upsert that
// takes the key's row lock and raises the token only if it is not lower,
// then the write, then commit. Writers of one key wait for each other on
// the row lock; a stale token gets a *fence.StaleTokenError and the write
// is not run; any failure rolls back the token and the write together.
// Several processes may share the table: the row lock serializes them.
//
//	pool, _ := pgxpool.New(ctx, dsn)
//	store, err := pgfence.New(ctx, pool)
//	err = store.AdmitTx(ctx, "orders/17", token, func(tx pgx.Tx) error {
//		_, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = 17`)
//		return err
//	})
//	if errors.Is(err, fence.ErrStaleToken) {
//		// a newer holder has written: nothing of ours was applied
//	}
//
// # Row-level fencing
//
// A table gets a token column with AddTokenColumn (bigint NOT NULL DEFAULT
// 0, "fence_token" by default). Update and Upsert then write a row in one
// conditional statement, atomic without a transaction, that applies only if
// the row's token is not higher than the write's, and set the token:
//
//	err := pgfence.AddTokenColumn(ctx, pool, "orders", "")
//	err = pgfence.Update(ctx, pool, pgfence.UpdateRow{
//		Table: "orders",
//		Set:   []pgfence.Column{{Name: "status", Value: "paid"}},
//		Where: []pgfence.Column{{Name: "id", Value: 17}},
//		Token: token,
//	})
//	// stale: "stale fencing token 33 < 34 for key orders/17"
//
// Table and column names are quoted, always: any name works ("order items",
// "select"), and it must be spelled as stored (PostgreSQL folds unquoted
// names to lower case when it creates them). Tables are found through the
// search_path.
//
// # Caveats
//
// Tokens are stored as bigint: tokens above math.MaxInt64 are refused with
// fence.ErrInvalidArgument. Keys are PostgreSQL text, so they must be valid
// UTF-8 without NUL bytes. Only writes that go through the fence are
// fenced: a plain UPDATE of the same rows bypasses it.
package pgfence

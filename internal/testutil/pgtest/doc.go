// Package pgtest gives tests a real PostgreSQL: the DSN of the test server,
// and a fresh schema per test so that tests run in parallel and re-run
// without seeing each other's tables.
//
// The server's DSN is read from FENCE_TEST_POSTGRES; scripts/postgres.sh
// starts a throwaway server and prints it, and scripts/test.sh does both:
//
//	export FENCE_TEST_POSTGRES="$(scripts/postgres.sh)"
//	go test ./fencing/...
//
// Without FENCE_TEST_POSTGRES a test is skipped, except under CI (CI set to
// anything), where a missing database fails the test.
//
//	func TestX(t *testing.T) {
//		dsn := pgtest.Schema(t) // connections default to the test's own schema
//		pool, err := pgxpool.New(ctx, dsn)
//		...
//	}
//
// Like all of internal/testutil/, it is test scaffolding: only tests import
// it.
package pgtest

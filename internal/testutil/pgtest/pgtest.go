package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvDSN is the environment variable holding the test server's DSN.
const EnvDSN = "FENCE_TEST_POSTGRES"

// DSN returns the DSN of the PostgreSQL server for tests, from
// FENCE_TEST_POSTGRES. If it is empty the test is skipped, or, when the
// environment variable CI is not empty, failed: CI must not pass by
// skipping the database tests.
func DSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(EnvDSN)
	if dsn != "" {
		return dsn
	}
	const how = "start one with scripts/postgres.sh and set " + EnvDSN + " to the DSN it prints (scripts/test.sh does both)"
	if os.Getenv("CI") != "" {
		t.Fatalf("%s is not set, and CI is: the PostgreSQL tests must run in CI; %s", EnvDSN, how)
	}
	t.Skipf("%s is not set: skipping the PostgreSQL tests; %s", EnvDSN, how)
	return ""
}

// Schema creates a schema of its own for the test (named fence_test_ and
// random hex) and returns a DSN whose connections have it as their
// search_path, so unqualified tables are created and found there. The
// schema and all in it are dropped when the test ends. It skips or fails
// the test as DSN does when there is no server.
func Schema(t testing.TB) string {
	t.Helper()
	dsn := DSN(t)
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	schema := "fence_test_" + hex.EncodeToString(b[:])
	exec(t, dsn, "CREATE SCHEMA "+schema)
	t.Cleanup(func() { exec(t, dsn, "DROP SCHEMA "+schema+" CASCADE") })
	return WithSearchPath(t, dsn, schema)
}

// WithSearchPath returns dsn with search_path set to schema, in the DSN's
// own form (URL or keyword=value).
func WithSearchPath(t testing.TB, dsn, schema string) string {
	t.Helper()
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatalf("%s: %v", EnvDSN, err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " search_path=" + schema
}

// QueryRow runs q, a query of one row, on dsn and scans the row into
// dest, failing the test on any error.
func QueryRow(t testing.TB, dsn, q string, dest ...any) {
	t.Helper()
	withConn(t, dsn, q, func(ctx context.Context, conn *pgx.Conn) error {
		return conn.QueryRow(ctx, q).Scan(dest...)
	})
}

// exec runs sql on dsn, failing the test on any error.
func exec(t testing.TB, dsn, sql string) {
	t.Helper()
	withConn(t, dsn, sql, func(ctx context.Context, conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, sql)
		return err
	})
}

// withConn runs fn on a connection to dsn, failing the test with what
// (the statement) if it fails.
func withConn(t testing.TB, dsn, what string, fn func(ctx context.Context, conn *pgx.Conn) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connecting to the PostgreSQL of %s: %v", EnvDSN, err)
	}
	defer conn.Close(ctx)
	if err := fn(ctx, conn); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

package pgtest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/fencelock/fence/internal/testutil/pgtest"
)

// TestMissingDSN runs TestDSNHelper in a child process, without a DSN, with
// and without CI: under CI it must fail, elsewhere skip.
func TestMissingDSN(t *testing.T) {
	for _, tc := range []struct {
		ci       string
		wantFail bool
		wantOut  string
	}{
		{ci: "1", wantFail: true, wantOut: "FENCE_TEST_POSTGRES is not set, and CI is"},
		{ci: "", wantFail: false, wantOut: "--- SKIP: TestDSNHelper"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestDSNHelper$", "-test.v")
		cmd.Env = append(os.Environ(), "PGTEST_HELPER=1", "FENCE_TEST_POSTGRES=", "CI="+tc.ci)
		out, err := cmd.CombinedOutput()
		if failed := err != nil; failed != tc.wantFail {
			t.Errorf("CI=%q: failed %v, want %v; output:\n%s", tc.ci, failed, tc.wantFail, out)
		}
		if !strings.Contains(string(out), tc.wantOut) {
			t.Errorf("CI=%q: output lacks %q:\n%s", tc.ci, tc.wantOut, out)
		}
	}
}

func TestDSNHelper(t *testing.T) {
	if os.Getenv("PGTEST_HELPER") == "" {
		t.Skip("run by TestMissingDSN")
	}
	pgtest.DSN(t)
	t.Log("DSN returned")
}

func TestSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var schema string
	t.Run("own schema", func(t *testing.T) {
		dsn := pgtest.Schema(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "CREATE TABLE t (x int)"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT table_schema FROM information_schema.tables WHERE table_name = 't' AND table_schema = current_schema()").Scan(&schema); err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(schema, "fence_test_") {
			t.Fatalf("table t is in schema %q", schema)
		}
	})
	conn, err := pgx.Connect(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = $1", schema).Scan(&n); err != nil || n != 0 {
		t.Fatalf("schema %s still exists after the test: %d, %v", schema, n, err)
	}
}

func TestWithSearchPath(t *testing.T) {
	for dsn, want := range map[string]string{
		"postgres://fence@127.0.0.1:54329/fence?sslmode=disable": "postgres://fence@127.0.0.1:54329/fence?search_path=s&sslmode=disable",
		"host=127.0.0.1 user=fence dbname=fence":                 "host=127.0.0.1 user=fence dbname=fence search_path=s",
	} {
		if got := pgtest.WithSearchPath(t, dsn, "s"); got != want {
			t.Errorf("WithSearchPath(%q) = %q, want %q", dsn, got, want)
		}
	}
}

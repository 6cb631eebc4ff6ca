package sqlgen

import (
	"database/sql"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/fencelock/fence"
)

func TestIdent(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"orders", `"orders"`},
		{"order items", `"order items"`},
		{"select", `"select"`},
		{`a"b`, `"a""b"`},
		{`"`, `""""`},
		{`x"; DROP TABLE t; --`, `"x""; DROP TABLE t; --"`},
		{"", `""`},
		{"Ünïcode", `"Ünïcode"`},
	} {
		if got := Ident(tc.name); got != tc.want {
			t.Errorf("Ident(%q) = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestPlaceholder(t *testing.T) {
	if got := Postgres.Placeholder(3); got != "$3" {
		t.Errorf("Postgres.Placeholder(3) = %q", got)
	}
	if got := SQLite.Placeholder(12); got != "?12" {
		t.Errorf("SQLite.Placeholder(12) = %q", got)
	}
	defer func() {
		if recover() == nil {
			t.Error("Placeholder of an unknown dialect did not panic")
		}
	}()
	Dialect(0).Placeholder(1)
}

var orderRow = Row{
	Table:       "order items",
	Key:         []Column{{"id", 17}, {"line", 2}},
	Set:         []Column{{"select", "x"}, {"qty", 5}},
	TokenColumn: "tok",
	Token:       34,
}

func TestStatements(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  Stmt
		want Stmt
	}{
		{
			"update postgres", UpdateStmt(Postgres, orderRow, 34),
			Stmt{`UPDATE "order items" SET "select" = $1, "qty" = $2, "tok" = $5 WHERE "id" = $3 AND "line" = $4 AND "tok" <= $5`,
				[]any{"x", 5, 17, 2, int64(34)}},
		},
		{
			"update sqlite, nothing but the token", UpdateStmt(SQLite, Row{Table: "t", Key: []Column{{"k", "a"}}}, 7),
			Stmt{`UPDATE "t" SET "fence_token" = ?2 WHERE "k" = ?1 AND "fence_token" <= ?2`, []any{"a", int64(7)}},
		},
		{
			"upsert postgres", UpsertStmt(Postgres, orderRow, 34),
			Stmt{`INSERT INTO "order items" ("id", "line", "select", "qty", "tok") VALUES ($1, $2, $3, $4, $5)` +
				` ON CONFLICT ("id", "line") DO UPDATE SET "select" = EXCLUDED."select", "qty" = EXCLUDED."qty", "tok" = EXCLUDED."tok"` +
				` WHERE "order items"."tok" <= EXCLUDED."tok"`,
				[]any{17, 2, "x", 5, int64(34)}},
		},
		{
			"upsert sqlite", UpsertStmt(SQLite, Row{Table: `we"ird`, Key: []Column{{"k", 1}}, Set: []Column{{"v", 2}}}, 9),
			Stmt{`INSERT INTO "we""ird" ("k", "v", "fence_token") VALUES (?1, ?2, ?3)` +
				` ON CONFLICT ("k") DO UPDATE SET "v" = EXCLUDED."v", "fence_token" = EXCLUDED."fence_token"` +
				` WHERE "we""ird"."fence_token" <= EXCLUDED."fence_token"`,
				[]any{1, 2, int64(9)}},
		},
		{
			"lookup", LookupStmt(Postgres, orderRow),
			Stmt{`SELECT count(*), coalesce(max("tok"), 0) FROM "order items" WHERE "id" = $1 AND "line" = $2`, []any{17, 2}},
		},
	} {
		if tc.got.SQL != tc.want.SQL {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, tc.got.SQL, tc.want.SQL)
		}
		if !reflect.DeepEqual(tc.got.Args, tc.want.Args) {
			t.Errorf("%s: args %#v, want %#v", tc.name, tc.got.Args, tc.want.Args)
		}
	}
}

func TestAddColumnSQL(t *testing.T) {
	if got, want := AddColumnSQL(Postgres, "order items", ""), `ALTER TABLE "order items" ADD COLUMN IF NOT EXISTS "fence_token" bigint NOT NULL DEFAULT 0`; got != want {
		t.Errorf("postgres:\n got %s\nwant %s", got, want)
	}
	if got, want := AddColumnSQL(SQLite, "t", "select"), `ALTER TABLE "t" ADD COLUMN "select" INTEGER NOT NULL DEFAULT 0`; got != want {
		t.Errorf("sqlite:\n got %s\nwant %s", got, want)
	}
}

func TestKeyString(t *testing.T) {
	if got := orderRow.KeyString(); got != "order items/17/2" {
		t.Errorf("KeyString = %q", got)
	}
}

func TestValidate(t *testing.T) {
	ok := Row{Table: "t", Key: []Column{{"id", 1}}, Token: 1}
	for _, tc := range []struct {
		name string
		row  func(r Row) Row
		msg  string
	}{
		{"no table", func(r Row) Row { r.Table = ""; return r }, "no Table"},
		{"no key", func(r Row) Row { r.Key = nil; return r }, "no Where columns"},
		{"unnamed key column", func(r Row) Row { r.Key = []Column{{"", 1}}; return r }, "column 0 has no name"},
		{"unnamed set column", func(r Row) Row { r.Set = []Column{{"a", 1}, {"", 2}}; return r }, "column 1 has no name"},
		{"token 0", func(r Row) Row { r.Token = 0; return r }, "needs a fencing token"},
		{"token too big", func(r Row) Row { r.Token = math.MaxInt64 + 1; return r }, "above 9223372036854775807"},
	} {
		_, err := tc.row(ok).Validate(Update)
		if !errors.Is(err, fence.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrInvalidArgument saying %q", tc.name, err, tc.msg)
		}
	}
	if tok, err := (Row{Table: "t", Key: []Column{{"id", 1}}, Token: math.MaxInt64}).Validate(Upsert); err != nil || tok != math.MaxInt64 {
		t.Errorf("largest token: %d, %v", tok, err)
	}
	if _, err := (Row{Table: "t", Token: 1}).Validate(Upsert); err == nil || !strings.Contains(err.Error(), "no Key columns") {
		t.Errorf("upsert without key: %v", err)
	}
}

// FuzzIdent checks Ident against a real SQLite: a table and a column named
// by any string (without NUL, which SQL text cannot carry) are created under
// exactly that name, and nothing else is created or dropped.
func FuzzIdent(f *testing.F) {
	for _, s := range []string{"orders", "order items", "select", `a"b`, `"`, `""`, `x" INTEGER); DROP TABLE victim; --`,
		"x'y", "[x]", "`x`", "ünï", "a;b", "\n", " ", "\\", `"; --`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		db, err := sql.Open("sqlite", ":memory:")
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		db.SetMaxOpenConns(1) // one in-memory database
		if _, err := db.Exec(`CREATE TABLE victim (x INTEGER)`); err != nil {
			t.Fatal(err)
		}
		_, err = db.Exec("CREATE TABLE " + Ident(name) + " (" + Ident(name) + " INTEGER)")
		if strings.ContainsRune(name, 0) || strings.EqualFold(name, "victim") || strings.HasPrefix(strings.ToLower(name), "sqlite_") {
			// SQL text ends at NUL, inside the quotes; the other names are
			// taken or reserved. SQLite must refuse, not misparse.
			if err == nil && strings.ContainsRune(name, 0) {
				t.Fatalf("a name with NUL was accepted: %q", name)
			}
			return
		}
		if err != nil {
			t.Fatalf("CREATE TABLE %s: %v", Ident(name), err)
		}
		var tables []string
		rows, err := db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var n string
			if err := rows.Scan(&n); err != nil {
				t.Fatal(err)
			}
			tables = append(tables, n)
		}
		rows.Close()
		want := []string{name, "victim"}
		if name > "victim" {
			want = []string{"victim", name}
		}
		if !reflect.DeepEqual(tables, want) {
			t.Fatalf("tables %q, want %q", tables, want)
		}
		var col string
		if err := db.QueryRow(`SELECT name FROM pragma_table_info(?1)`, name).Scan(&col); err != nil || col != name {
			t.Fatalf("column %q, %v; want %q", col, err, name)
		}
	})
}

package sqlgen_test

import (
	"fmt"

	"github.com/fencelock/fence/internal/sqlgen"
)

func ExampleUpdateStmt() {
	row := sqlgen.Row{
		Table: "order items",
		Key:   []sqlgen.Column{{Name: "id", Value: 17}},
		Set:   []sqlgen.Column{{Name: "select", Value: "paid"}},
		Token: 34,
	}
	for _, d := range []sqlgen.Dialect{sqlgen.Postgres, sqlgen.SQLite} {
		s := sqlgen.UpdateStmt(d, row, 34)
		fmt.Println(s.SQL, s.Args)
	}
	fmt.Println(row.KeyString())
	// Output:
	// UPDATE "order items" SET "select" = $1, "fence_token" = $3 WHERE "id" = $2 AND "fence_token" <= $3 [paid 17 34]
	// UPDATE "order items" SET "select" = ?1, "fence_token" = ?3 WHERE "id" = ?2 AND "fence_token" <= ?3 [paid 17 34]
	// order items/17
}

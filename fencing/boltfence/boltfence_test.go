package boltfence_test

import (
	"path/filepath"
	"testing"

	"github.com/fencelock/fence/fencing/boltfence"
	"github.com/fencelock/fence/fencing/fencingtest"
)

func TestConformance(t *testing.T) {
	fencingtest.Run(t, fencingtest.Durable(
		func(t testing.TB) string { return filepath.Join(t.TempDir(), "tokens.db") },
		func(t testing.TB, path string) *boltfence.Store {
			s, err := boltfence.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	))
}

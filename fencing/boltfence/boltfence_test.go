package boltfence_test

import (
	"path/filepath"
	"testing"

	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/fencing/boltfence"
	"github.com/fencelock/fence/fencing/fencingtest"
)

func TestConformance(t *testing.T) {
	open := func(t *testing.T, path string) fencing.Store {
		s, err := boltfence.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	paths := map[fencing.Store]string{}
	fencingtest.Run(t, fencingtest.Factory{
		Open: func(t *testing.T) fencing.Store {
			path := filepath.Join(t.TempDir(), "tokens.db")
			s := open(t, path)
			paths[s] = path
			return s
		},
		Reopen: func(t *testing.T, s fencing.Store) fencing.Store {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2 := open(t, paths[s])
			paths[s2] = paths[s]
			return s2
		},
	})
}

package fencing_test

import (
	"testing"

	"github.com/fencelock/fence/fencing"
	"github.com/fencelock/fence/fencing/fencingtest"
)

func TestMemoryConformance(t *testing.T) {
	fencingtest.Run(t, fencingtest.Factory{
		Open: func(t *testing.T) fencing.Store { return fencing.NewMemory() },
	})
}

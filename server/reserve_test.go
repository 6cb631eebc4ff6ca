package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence/server/internal/durable"
)

// A node whose log lost its last entries without anyone noticing (here:
// cut off on purpose) still hands out no token it handed out before: its
// token reserve, kept apart from the log, lifts the floor.
func TestTokensStayAboveTheReserveAfterALostLogTail(t *testing.T) {
	c := newCorruptionNode(t, LogStoreWAL, nil)
	var highest uint64
	c.run(func(s *Server) {
		a := newAPI(t, s)
		session := a.session(time.Minute)
		for i := range 20 {
			highest = a.mustAcquire(session, fmt.Sprintf("lock-%d", i))
		}
	})
	w, done := mustOpenWAL(t, filepath.Join(c.cfg.DataDir, "wal"))
	last, _ := w.LastIndex()
	if err := w.DeleteRange(last-9, last); err != nil {
		t.Fatal(err)
	}
	done()

	c.run(func(s *Server) {
		a := newAPI(t, s)
		token := a.mustAcquire(a.session(time.Minute), "after")
		if token <= highest {
			t.Fatalf("after the log lost its tail the node granted token %d; it had granted up to %d", token, highest)
		}
	})
}

func TestTheReserveIsWrittenAheadOfTheTokens(t *testing.T) {
	s, a := startWithAPI(t, nil)
	token := a.mustAcquire(a.session(time.Minute), "x")
	r, err := durable.OpenTokenReserve(s.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	if r.Floor() < token {
		t.Fatalf("the reserve on disk is %d, below the token %d already answered", r.Floor(), token)
	}
}

func TestDamagedReserveStopsTheNode(t *testing.T) {
	c := newCorruptionNode(t, LogStoreWAL, nil)
	c.run(func(s *Server) {
		a := newAPI(t, s)
		a.mustAcquire(a.session(time.Minute), "x")
	})
	path := filepath.Join(c.cfg.DataDir, durable.ReserveFile)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(data), "up-to 1", "up-to 9", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	err = c.startErr()
	for _, want := range []string{"token reserve", path, "damaged", "move the file aside"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
}

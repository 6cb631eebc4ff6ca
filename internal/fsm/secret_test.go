package fsm_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/fencelock/fence"
	"github.com/fencelock/fence/internal/fsm"
	"github.com/fencelock/fence/internal/fsmpb"
)

func createSessionWithSecret(secret string) *fsmpb.Command {
	cmd := newSession()
	cmd.GetCreateSession().SecretSha256 = fsm.SecretHash(secret)
	return cmd
}

// A session created with a secret's hash accepts that secret only; a
// legacy session (no hash, as older versions logged) accepts its id alone.
// The errors name the session, never the secret.
func TestAuthorizeSession(t *testing.T) {
	s := fsm.NewState()
	id := mustApply(t, s, createSessionWithSecret("s3cret-of-one")).CreateSession().SessionID
	legacy := mustApply(t, s, newSession()).CreateSession().SessionID
	tests := []struct {
		name    string
		session uint64
		secret  string
		want    error
	}{
		{"its secret", id, "s3cret-of-one", nil},
		{"another secret", id, "s3cret-of-two", fence.ErrSessionSecret},
		{"a prefix of it", id, "s3cret", fence.ErrSessionSecret},
		{"no secret", id, "", fence.ErrSessionSecret},
		{"legacy, no secret", legacy, "", nil},
		{"legacy, any secret", legacy, "whatever", nil},
		{"unknown session", 99, "s3cret-of-one", fence.ErrSessionNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.AuthorizeSession(tt.session, tt.secret)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("AuthorizeSession = %v, want %v", err, tt.want)
			}
			if err != nil && tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
				t.Fatalf("the error shows the secret: %v", err)
			}
			if tt.want == fence.ErrSessionSecret && !errors.Is(err, fence.ErrUnauthenticated) {
				t.Fatalf("%v does not wrap ErrUnauthenticated", err)
			}
		})
	}
	if info, _ := s.Session(id); info.Legacy {
		t.Fatalf("session %d with a secret is marked legacy", id)
	}
	if info, _ := s.Session(legacy); !info.Legacy {
		t.Fatalf("session %d without a secret is not marked legacy", legacy)
	}
}

// The hash survives a snapshot, and a snapshot of an older version
// (sessions without hashes) restores them as legacy sessions.
func TestSessionSecretSurvivesSnapshot(t *testing.T) {
	s := fsm.NewState()
	id := mustApply(t, s, createSessionWithSecret("kept")).CreateSession().SessionID
	legacy := mustApply(t, s, newSession()).CreateSession().SessionID
	r := mustRestore(t, s)
	if err := r.AuthorizeSession(id, "kept"); err != nil {
		t.Fatalf("after restore, the secret: %v", err)
	}
	if err := r.AuthorizeSession(id, ""); !errors.Is(err, fence.ErrSessionSecret) {
		t.Fatalf("after restore, no secret: %v", err)
	}
	if err := r.AuthorizeSession(legacy, ""); err != nil {
		t.Fatalf("after restore, the legacy session: %v", err)
	}
	// An older version's snapshot has no hash field at all.
	old := s.Snapshot()
	for _, ps := range old.Sessions {
		ps.SecretSha256 = nil
	}
	r2, err := fsm.Restore(old)
	if err != nil {
		t.Fatal(err)
	}
	if info, _ := r2.Session(id); !info.Legacy {
		t.Fatalf("session %d from an older snapshot is not legacy", id)
	}
}

// A hash of the wrong length is refused and creates nothing.
func TestCreateSessionRefusesABadHash(t *testing.T) {
	s := fsm.NewState()
	cmd := createSession(time.Minute, "x", 0)
	cmd.GetCreateSession().SecretSha256 = []byte("short")
	if res := s.Apply(cmd); !errors.Is(res.Err, fence.ErrInvalidArgument) {
		t.Fatalf("Apply = %+v, want ErrInvalidArgument", res)
	}
	if s.NumSessions() != 0 {
		t.Fatalf("%d sessions after a refused CreateSession", s.NumSessions())
	}
	snap := s.Snapshot()
	snap.Sessions = append(snap.Sessions, &fsmpb.Session{Id: 1, TtlNs: int64(time.Minute), SecretSha256: []byte("short")})
	snap.LastSessionId = 1
	if _, err := fsm.Restore(snap); err == nil {
		t.Fatal("a snapshot with a short secret hash was restored")
	}
}

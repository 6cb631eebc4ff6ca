package server

import (
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"slices"

	"github.com/fencelock/fence/internal/fsm"
)

// Sessions are capabilities (docs/design.md, Session secrets). The leader
// draws each new session's secret here, at the edge, and commits only its
// hash; every call that acts as a session is checked by authorizeSession
// on the ready leader before anything is proposed. A follower forwards such
// calls to the leader (or answers Unavailable), so every call is checked
// once, by the leader, against the replicated state.

// secretBytes is the size of a session's secret and of a bearer token:
// 256 bits from crypto/rand, sent base64url-encoded (43 characters).
const secretBytes = 32

// newSecret draws a session's secret or a bearer token.
func newSecret() string {
	b := make([]byte, secretBytes)
	rand.Read(b) // never fails (crypto/rand panics rather than return short)
	return base64.RawURLEncoding.EncodeToString(b)
}

// authorizeSession checks that secret is session id's, on the ready leader
// (a node that is not answers Unavailable, naming the leader): an unknown
// session is ErrSessionNotFound, a wrong or missing secret
// ErrSessionSecret. A secret checked once stays right for as long as the
// session lives: a session's hash never changes and its id is never
// reused, so the command proposed after the check either acts as the
// session it was checked against or finds it gone.
func (s *Server) authorizeSession(id uint64, secret string) error {
	if err := checkSessionID(id); err != nil {
		return err
	}
	if !s.leaderReady.Load() {
		return s.notReady()
	}
	var err error
	s.fsm.Read(func(st *fsm.State) { err = st.AuthorizeSession(id, secret) })
	return err
}

// authorizeSessions is authorizeSession for each renewal of rs that has no
// error yet, setting the error of each that fails.
func (s *Server) authorizeSessions(rs []renewal) {
	if !s.leaderReady.Load() {
		err := s.notReady()
		for i := range rs {
			rs[i].err = cmp.Or(rs[i].err, err)
		}
		return
	}
	for chunk := range slices.Chunk(rs, renewalChunk) {
		s.fsm.Read(func(st *fsm.State) {
			for i := range chunk {
				if r := &chunk[i]; r.err == nil {
					r.err = st.AuthorizeSession(r.id, r.secret)
				}
			}
		})
	}
}

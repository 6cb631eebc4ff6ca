package fsm

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"

	"github.com/fencelock/fence"
)

// Sessions are capabilities (docs/design.md, Session secrets): the leader
// draws a secret for each new session, answers it to the creator alone and
// commits only its SHA-256, in CreateSession. A call that acts as the
// session must present the secret; the server checks it with
// AuthorizeSession against the replicated state before it proposes
// anything. The state machine draws nothing and hashes nothing in Apply.

// SecretHashBytes is the length of a session secret's hash (SHA-256).
const SecretHashBytes = sha256.Size

// SecretHash returns the hash the state keeps of a session secret.
func SecretHash(secret string) []byte {
	h := sha256.Sum256([]byte(secret))
	return h[:]
}

// AuthorizeSession reports whether secret is session id's: nil if it is,
// an error wrapping fence.ErrSessionNotFound if the session does not exist,
// and one wrapping fence.ErrSessionSecret if the secret is missing or
// another. The comparison takes the same time whatever the secret. A
// legacy session (created before sessions had secrets) accepts any
// secret, or none. The error never contains the secret.
func (s *State) AuthorizeSession(id uint64, secret string) error {
	sess, err := s.session(id)
	if err != nil {
		return err
	}
	if sess.secretHash == nil {
		return nil
	}
	if subtle.ConstantTimeCompare(SecretHash(secret), sess.secretHash) != 1 {
		if secret == "" {
			return fmt.Errorf("%w: session %d needs its secret (session_secret), which CreateSession answered to its creator", fence.ErrSessionSecret, id)
		}
		return fmt.Errorf("%w: the secret given is not session %d's; only its creator, with the secret CreateSession answered, may act as it", fence.ErrSessionSecret, id)
	}
	return nil
}

func (sess *session) info() SessionInfo {
	return SessionInfo{ID: sess.id, TTL: sess.ttl, Owner: sess.owner, Legacy: sess.secretHash == nil}
}

func nilIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return b
}

// Package storage is the article's storage: a service that keeps one value
// per key, read with GET /KEY and written with PUT /KEY, and that a fencing
// guard may protect. `fence demo` serves it in its own process, once bare
// and once behind fencing.Middleware (examples/fenced-storage, which must
// build outside this repository, carries a storage of its own). Put is its
// client: a write that carries the fencing token of its context. It is part
// of the fence tool (cmd/fence/internal/).
package storage

import (
	"io"
	"net/http"
	"strings"
	"sync"
)

// maxValue bounds the value of one write.
const maxValue = 1 << 20

// Store keeps the last value written per key and serves GET and PUT /KEY
// over HTTP. It checks no token itself: wrap it in fencing.Middleware for
// that. It is safe for concurrent use.
type Store struct {
	// OnPut, when set, is called after each write is stored, with the
	// request (whose context carries the token the fencing middleware
	// admitted it with, if any). Set it before serving.
	OnPut func(r *http.Request, key, value string)

	mu     sync.Mutex
	values map[string]string
}

// New returns an empty store.
func New() *Store { return &Store{values: map[string]string{}} }

// ServeHTTP implements http.Handler: GET /KEY answers the value (404 if
// there is none), PUT /KEY stores the body and answers 204 No Content.
func (s *Store) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/")
	switch r.Method {
	case http.MethodGet:
		v, ok := s.Value(key)
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, v)
	case http.MethodPut:
		body, err := io.ReadAll(io.LimitReader(r.Body, maxValue))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.put(key, string(body))
		if s.OnPut != nil {
			s.OnPut(r, key, string(body))
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
	}
}

// Value returns the value of key, and whether there is one.
func (s *Store) Value(key string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.values[key]
	return v, ok
}

func (s *Store) put(key, value string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.values[key] = value
}

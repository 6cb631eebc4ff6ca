package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/fencelock/fence/fencing"
)

// values is the storage's data: the last value written per key. GET /KEY
// answers the value (404 if there is none); PUT /KEY stores the body, of at
// most 1 MiB, and answers 204 No Content. It checks no token itself: the
// fencing guard in front of it does. It is safe for concurrent use.
type values struct {
	mu sync.Mutex
	m  map[string]string
}

func (v *values) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := strings.TrimPrefix(r.URL.Path, "/")
	switch r.Method {
	case http.MethodGet:
		v.mu.Lock()
		value, ok := v.m[key]
		v.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, value)
	case http.MethodPut:
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		value := string(body)
		v.mu.Lock()
		v.m[key] = value
		v.mu.Unlock()
		// The guard put the token it admitted the write with on the
		// request's context.
		lock, token, _ := fencing.TokenFrom(r.Context())
		fmt.Printf("%s storage: accepted %s=%q with token %d of lock %s\n", stamp(), key, value, token, lock)
		w.WriteHeader(http.StatusNoContent)
	default:
		http.Error(w, "GET or PUT", http.StatusMethodNotAllowed)
	}
}

// storageClient sends the fencing token of each request's context in the
// request's headers (fencing.Transport).
var storageClient = &http.Client{Transport: &fencing.Transport{}, Timeout: 10 * time.Second}

// put writes value to url (the storage's URL and /KEY) with the fencing
// token set on ctx by fencing.WithToken. A write the guard refused returns
// fencing.ResponseError's error, which wraps fence.ErrStaleToken for a
// stale token; any other answer but a 2xx returns its status and body.
func put(ctx context.Context, url, value string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(value))
	if err != nil {
		return fmt.Errorf("writing %s: %w", url, err)
	}
	resp, err := storageClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := fencing.ResponseError(resp); err != nil {
		return err
	}
	if resp.StatusCode >= 300 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

package storage

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/fencelock/fence/fencing"
)

// putTimeout bounds one write, its answer included.
const putTimeout = 10 * time.Second

// client sends each request's fencing token, if its context has one.
var client = &http.Client{Transport: &fencing.Transport{}, Timeout: putTimeout}

// StatusError is an answer to a write that is neither a success nor a
// rejection by the fencing guard.
type StatusError struct {
	Code   int
	Status string // as "503 Service Unavailable"
	Body   string // its start, trimmed
}

func (e *StatusError) Error() string { return e.Status + ": " + e.Body }

// Put writes value to url (the storage's URL and /KEY) with PUT. A fencing
// token set on ctx with fencing.WithToken goes with it. It returns the
// status of the answer, if there was one, and: nil for a 2xx; the error of
// a write the fencing guard rejected (fencing.ResponseError: a
// *fence.StaleTokenError for a stale token); a *StatusError for any other
// answer; or the error that kept the write from being answered.
func Put(ctx context.Context, url, value string) (status int, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, strings.NewReader(value))
	if err != nil {
		return 0, fmt.Errorf("writing %s: %w", url, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if err := fencing.ResponseError(resp); err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode >= 300 {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return resp.StatusCode, &StatusError{Code: resp.StatusCode, Status: resp.Status, Body: strings.TrimSpace(string(body))}
	}
	return resp.StatusCode, nil
}

package fencing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/fencelock/fence"
)

// The headers that carry a write's lock name and fencing token, over HTTP
// and as gRPC metadata (where they are lower-cased).
const (
	HeaderLock  = "Fence-Lock"
	HeaderToken = "Fence-Token"
)

type tokenKey struct{}

type stamped struct {
	lock  string
	token uint64
}

// WithToken returns a context whose outgoing requests (through Transport or
// the Connect interceptor) carry lock and token.
func WithToken(ctx context.Context, lock string, token uint64) context.Context {
	return context.WithValue(ctx, tokenKey{}, stamped{lock, token})
}

// TokenFrom returns the lock and token of WithToken, or of an incoming
// request admitted by Middleware or the interceptor.
func TokenFrom(ctx context.Context) (lock string, token uint64, ok bool) {
	s, ok := ctx.Value(tokenKey{}).(stamped)
	return s.lock, s.token, ok
}

// ParseToken parses a token header value: a decimal number from 1 up.
func ParseToken(s string) (uint64, error) {
	if s == "" {
		return 0, fmt.Errorf("%w: the %s header is missing", fence.ErrInvalidArgument, HeaderToken)
	}
	token, err := strconv.ParseUint(s, 10, 64)
	if err != nil || token == 0 {
		return 0, fmt.Errorf("%w: %s %q is not a fencing token (a decimal number from 1 up)", fence.ErrInvalidArgument, HeaderToken, s)
	}
	return token, nil
}

// Transport stamps the lock and token of each request's context (see
// WithToken) onto its headers. Requests without one go out unchanged.
type Transport struct {
	// Base does the round trip; nil means http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	lock, token, ok := TokenFrom(req.Context())
	if !ok {
		return base.RoundTrip(req)
	}
	req = req.Clone(req.Context())
	req.Header.Set(HeaderToken, strconv.FormatUint(token, 10))
	if lock != "" {
		req.Header.Set(HeaderLock, lock)
	}
	return base.RoundTrip(req)
}

// ErrorBody is the JSON body of a request the middleware rejected.
type ErrorBody struct {
	// Code is "stale_token", "not_holder", "invalid_token" or "unavailable".
	Code    string `json:"code"`
	Message string `json:"message"`
	Key     string `json:"key,omitempty"`
	// Token and Highest are set for stale_token, as decimal strings.
	Token   string `json:"token,omitempty"`
	Highest string `json:"highest,omitempty"`
}

// ResponseError returns the fence error of a response the middleware
// rejected (a *fence.StaleTokenError for 409 stale_token), or nil for any
// other response. It reads and closes the body of a rejected response.
func ResponseError(resp *http.Response) error {
	if resp.StatusCode < 400 || resp.Header.Get("Content-Type") != "application/json" {
		return nil
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		return err
	}
	var body ErrorBody
	if json.Unmarshal(data, &body) != nil || body.Code == "" {
		return fmt.Errorf("HTTP %d: %s", resp.StatusCode, data)
	}
	switch body.Code {
	case "stale_token":
		token, _ := strconv.ParseUint(body.Token, 10, 64)
		highest, _ := strconv.ParseUint(body.Highest, 10, 64)
		return &fence.StaleTokenError{Key: body.Key, Token: token, Highest: highest}
	case "not_holder":
		return fmt.Errorf("%w: %s", fence.ErrNotHolder, body.Message)
	case "invalid_token":
		return fmt.Errorf("%w: %s", fence.ErrInvalidArgument, body.Message)
	}
	return fmt.Errorf("%w: %s", fence.ErrUnavailable, body.Message)
}

// MiddlewareOption configures Middleware.
type MiddlewareOption func(*middleware)

type middleware struct {
	key     func(r *http.Request) string
	guarded func(r *http.Request) bool
}

// WithKey sets how a request names the resource it writes (default: the
// Fence-Lock header, or the URL path when there is none).
func WithKey(key func(r *http.Request) string) MiddlewareOption {
	return func(m *middleware) { m.key = key }
}

// WithGuarded sets which requests are writes that need a token (default:
// every method but GET, HEAD and OPTIONS).
func WithGuarded(guarded func(r *http.Request) bool) MiddlewareOption {
	return func(m *middleware) { m.guarded = guarded }
}

// Middleware guards an HTTP handler with the fenced write rule. A guarded
// request must carry Fence-Token (and Fence-Lock in strict mode); it runs
// inside g.Admit, so writers of one key are serialized and a handler that
// answers 2xx or 3xx records the token. A stale token gets 409 Conflict, a
// missing or malformed one 400, a token that is not the lock's current grant
// (strict mode) 409; each with an ErrorBody, and the handler is not called.
func Middleware(g *Guard, opts ...MiddlewareOption) func(http.Handler) http.Handler {
	m := middleware{
		key: func(r *http.Request) string {
			if lock := r.Header.Get(HeaderLock); lock != "" {
				return lock
			}
			return r.URL.Path
		},
		guarded: func(r *http.Request) bool {
			return r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions
		},
	}
	for _, opt := range opts {
		opt(&m)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !m.guarded(r) {
				next.ServeHTTP(w, r)
				return
			}
			token, err := ParseToken(r.Header.Get(HeaderToken))
			if err != nil {
				writeError(w, "", err)
				return
			}
			lock, key := r.Header.Get(HeaderLock), m.key(r)
			rec := &statusRecorder{ResponseWriter: w}
			err = g.Admit(r.Context(), key, lock, token, func(ctx context.Context) error {
				next.ServeHTTP(rec, r.WithContext(WithToken(ctx, lock, token)))
				if rec.status() >= 400 {
					return errHandlerFailed
				}
				return nil
			})
			if err != nil && !errors.Is(err, errHandlerFailed) && !rec.wrote {
				writeError(w, key, err)
			}
		})
	}
}

// errHandlerFailed marks a guarded handler that answered an error: its
// token is not recorded, and its response has already been written.
var errHandlerFailed = errors.New("fencing: the guarded handler failed")

func writeError(w http.ResponseWriter, key string, err error) {
	body := ErrorBody{Message: err.Error(), Key: key}
	status := http.StatusServiceUnavailable
	var stale *fence.StaleTokenError
	switch {
	case errors.As(err, &stale):
		status, body.Code = http.StatusConflict, "stale_token"
		body.Token, body.Highest = strconv.FormatUint(stale.Token, 10), strconv.FormatUint(stale.Highest, 10)
	case errors.Is(err, fence.ErrNotHolder):
		status, body.Code = http.StatusConflict, "not_holder"
	case errors.Is(err, fence.ErrInvalidArgument):
		status, body.Code = http.StatusBadRequest, "invalid_token"
	default:
		body.Code = "unavailable"
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // the message's "<" is read by people and programs, not a browser
	_ = enc.Encode(body)
}

type statusRecorder struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.code, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if !r.wrote {
		r.code, r.wrote = http.StatusOK, true
	}
	return r.ResponseWriter.Write(p)
}

func (r *statusRecorder) status() int {
	if !r.wrote {
		return http.StatusOK
	}
	return r.code
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

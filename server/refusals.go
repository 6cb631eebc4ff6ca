package server

import (
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// explainRefusals gives the 405 and 415 answers of the RPC handlers, which
// Connect sends without a body, a JSON body in Connect's error form
// ({"code", "message"}) that says what to send instead: a GET on an RPC
// path, or a body of an unknown Content-Type, as from a bare curl.
func explainRefusals(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !mayBeRefused(r) {
			next.ServeHTTP(w, r) // unwrapped: streams need the writer's Flusher
			return
		}
		next.ServeHTTP(&refusalWriter{ResponseWriter: w, r: r}, r)
	})
}

// mayBeRefused reports whether r is an RPC call that Connect may answer
// with 405 or 415: not a POST, or a Content-Type no protocol it speaks
// uses. Every other request goes to the handlers untouched.
func mayBeRefused(r *http.Request) bool {
	if !strings.HasPrefix(r.URL.Path, "/fence.") && !strings.HasPrefix(r.URL.Path, "/grpc.") {
		return false
	}
	if r.Method != http.MethodPost {
		return true
	}
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	switch {
	case ct == "application/json", ct == "application/proto":
		return false
	case strings.HasPrefix(ct, "application/grpc"), strings.HasPrefix(ct, "application/connect+"):
		return false
	}
	return true
}

// refusalWriter writes the explanation in place of a 405 or 415 with no
// body of its own.
type refusalWriter struct {
	http.ResponseWriter
	r         *http.Request
	started   bool // a status was written, and passed on
	explained bool // a refusal was explained; what follows is dropped
}

func (w *refusalWriter) WriteHeader(code int) {
	if w.started || w.explained {
		return
	}
	if code != http.StatusMethodNotAllowed && code != http.StatusUnsupportedMediaType {
		w.started = true
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.explained = true
	reason := "unimplemented"
	msg := fmt.Sprintf("%s is not served on %s: send POST with Content-Type: application/json and a JSON request body (at least {}), as in `curl -H 'Content-Type: application/json' -d '{}' URL`; gRPC and Connect clients send their own", w.r.Method, w.r.URL.Path)
	if code == http.StatusUnsupportedMediaType {
		reason = "invalid_argument"
		msg = fmt.Sprintf("Content-Type %q is not served on %s: send application/json (a JSON request body, at least {}) or application/proto; gRPC and Connect clients send their own", w.r.Header.Get("Content-Type"), w.r.URL.Path)
	}
	body, _ := json.Marshal(map[string]string{"code": reason, "message": msg})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Del("Content-Length")
	w.ResponseWriter.WriteHeader(code)
	_, _ = w.ResponseWriter.Write(append(body, '\n'))
}

func (w *refusalWriter) Write(b []byte) (int, error) {
	if w.explained {
		return len(b), nil
	}
	if !w.started {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

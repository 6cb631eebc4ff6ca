package apinet

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// CheckEnvelopes answers InvalidArgument to a gRPC call of services (path
// prefixes, "/fence.v1.LockService/") whose body is not one well-formed
// message envelope. connect-go answers
// Internal to a truncated envelope or to a compressed message without a
// grpc-encoding, though the fault is the caller's and retrying it fails
// again. Streams of other services (reflection's are bidirectional) pass.
func CheckEnvelopes(next http.Handler, maxBytes int, services []string) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") || !HasAnyPrefix(r.URL.Path, services) {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(maxBytes)+5))
		if err != nil {
			errs.Write(w, r, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("reading the request: %w", err)))
			return
		}
		if err := envelopeError(body, r.Header.Get("Grpc-Encoding")); err != nil {
			errs.Write(w, r, connect.NewError(connect.CodeInvalidArgument, err))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// envelopeError says what is wrong with a gRPC request body that should be
// exactly one envelope: a flags byte, a big-endian length, the message.
func envelopeError(body []byte, encoding string) error {
	if len(body) < 5 {
		return fmt.Errorf("a gRPC request of %d bytes is shorter than a message envelope (5 bytes)", len(body))
	}
	flags, size := body[0], binary.BigEndian.Uint32(body[1:5])
	switch {
	case flags&^1 != 0:
		return fmt.Errorf("the gRPC message envelope has unknown flags %#x", flags)
	case flags == 1 && (encoding == "" || encoding == "identity"):
		return fmt.Errorf("the gRPC message is flagged compressed, but the request names no grpc-encoding")
	case uint64(size) != uint64(len(body)-5):
		return fmt.Errorf("the gRPC message envelope promises %d bytes, and the request carries %d after it", size, len(body)-5)
	}
	return nil
}

// HasAnyPrefix reports whether s begins with one of prefixes.
func HasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

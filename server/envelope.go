package server

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/fencelock/fence/api/fence/v1/fencev1connect"
)

// fenceServices are the services whose calls carry one request message.
var fenceServices = slices.Concat(forwardable, []string{"/" + fencev1connect.ClusterServiceName + "/"})

// checkEnvelopes answers InvalidArgument to a gRPC call of fence's services
// whose body is not one well-formed message envelope. connect-go answers
// Internal to a truncated envelope or to a compressed message without a
// grpc-encoding, though the fault is the caller's and retrying it fails
// again. Streams of other services (reflection's are bidirectional) pass.
func checkEnvelopes(next http.Handler, maxBytes int) http.Handler {
	errs := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") || !hasAnyPrefix(r.URL.Path, fenceServices) {
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

func hasAnyPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

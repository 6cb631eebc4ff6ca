// Package rpcerr carries fence's errors across Connect and gRPC: the server
// turns a sentinel-wrapping error into a status code plus an ErrorDetail, and
// the client turns that back into an error that wraps the same sentinel, so
// errors.Is works on both sides of the wire.
//
// It stands on the ground floor, on package fence's sentinels and the API's
// ErrorDetail: the server, the client and fencingconnect use it.
package rpcerr

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"

	"connectrpc.com/connect"

	"github.com/fencelock/fence"
	fencev1 "github.com/fencelock/fence/api/fence/v1"
)

var table = []struct {
	sentinel error
	code     connect.Code
	reason   fencev1.Reason
}{
	{fence.ErrInvalidArgument, connect.CodeInvalidArgument, fencev1.Reason_REASON_INVALID_ARGUMENT},
	{fence.ErrSessionNotFound, connect.CodeNotFound, fencev1.Reason_REASON_SESSION_NOT_FOUND},
	{fence.ErrLocked, connect.CodeFailedPrecondition, fencev1.Reason_REASON_LOCKED},
	{fence.ErrNotHolder, connect.CodeFailedPrecondition, fencev1.Reason_REASON_NOT_HOLDER},
	{fence.ErrStaleToken, connect.CodeFailedPrecondition, fencev1.Reason_REASON_STALE_TOKEN},
	{fence.ErrRevisionMismatch, connect.CodeFailedPrecondition, fencev1.Reason_REASON_REVISION_MISMATCH},
	{fence.ErrWaitTimeout, connect.CodeDeadlineExceeded, fencev1.Reason_REASON_WAIT_TIMEOUT},
	{fence.ErrDiskFull, connect.CodeUnavailable, fencev1.Reason_REASON_DISK_FULL}, // before ErrUnavailable, which it wraps
	{fence.ErrUnavailable, connect.CodeUnavailable, fencev1.Reason_REASON_NOT_LEADER},
	{fence.ErrLimit, connect.CodeResourceExhausted, fencev1.Reason_REASON_LIMIT},
	{fence.ErrCompacted, connect.CodeFailedPrecondition, fencev1.Reason_REASON_COMPACTED},
	{fence.ErrCancelled, connect.CodeFailedPrecondition, fencev1.Reason_REASON_CANCELLED},
	{fence.ErrWrongCluster, connect.CodeFailedPrecondition, fencev1.Reason_REASON_WRONG_CLUSTER},
	{fence.ErrSessionSecret, connect.CodeUnauthenticated, fencev1.Reason_REASON_SESSION_SECRET},
	{fence.ErrMembership, connect.CodeFailedPrecondition, fencev1.Reason_REASON_MEMBERSHIP},
	{fence.ErrAuthFailed, connect.CodeUnauthenticated, fencev1.Reason_REASON_AUTH},
	{fence.ErrPermissionDenied, connect.CodePermissionDenied, fencev1.Reason_REASON_PERMISSION_DENIED},
	{fence.ErrUnsupported, connect.CodeFailedPrecondition, fencev1.Reason_REASON_UNSUPPORTED},
}

// Detail is the extra information an error may carry across the wire.
type Detail struct {
	Lock          string
	SessionID     uint64
	LeaderAddress string
}

// DetailError attaches a Detail to an error.
type DetailError struct {
	Err    error
	Detail Detail
}

func (e *DetailError) Error() string { return e.Err.Error() }
func (e *DetailError) Unwrap() error { return e.Err }

// ToConnect converts a server-side error to a Connect error with a code and
// an ErrorDetail. Errors that wrap no fence sentinel become Internal, except
// context errors, which keep their meaning.
func ToConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	code, detail := classify(err)
	out := connect.NewError(code, errors.New(err.Error()))
	if d, derr := connect.NewErrorDetail(detail); derr == nil {
		out.AddDetail(d)
	}
	return out
}

// ToStream converts a server-side error to an operation's error on a
// stream: the code, message and detail ToConnect would give it.
func ToStream(err error) *fencev1.StreamError {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if errors.As(err, &ce) {
		return &fencev1.StreamError{Code: uint32(ce.Code()), Message: ce.Message(), Detail: ErrorDetailOf(ce)}
	}
	code, detail := classify(err)
	return &fencev1.StreamError{Code: uint32(code), Message: err.Error(), Detail: detail}
}

// classify finds an error's code and detail.
func classify(err error) (connect.Code, *fencev1.ErrorDetail) {
	detail := &fencev1.ErrorDetail{}
	var de *DetailError
	if errors.As(err, &de) {
		detail.Lock = de.Detail.Lock
		detail.SessionId = de.Detail.SessionID
		detail.LeaderAddress = de.Detail.LeaderAddress
	}
	var stale *fence.StaleTokenError
	if errors.As(err, &stale) {
		detail.Token, detail.CurrentToken = stale.Token, stale.Highest
		if detail.Lock == "" {
			detail.Lock = stale.Key
		}
	}
	var locked *fence.LockedError
	if errors.As(err, &locked) {
		detail.Lock = locked.Lock
		detail.HolderSessionId, detail.HolderToken = locked.HolderSession, locked.HolderToken
	}
	code := connect.CodeInternal
	switch {
	case errors.Is(err, context.Canceled):
		code = connect.CodeCanceled
	case errors.Is(err, context.DeadlineExceeded):
		code = connect.CodeDeadlineExceeded
	}
	for _, row := range table {
		if errors.Is(err, row.sentinel) {
			code, detail.Reason = row.code, row.reason
			break
		}
	}
	return code, detail
}

// ErrPlainToTLS is what a client transport reports when a node answered a
// plain HTTP request as Go's HTTPS server does: the node serves TLS.
var ErrPlainToTLS = errors.New("the node serves TLS, and the call was plain HTTP")

// The ways TLS between a client and a node fails, each wrapped, as
// ErrPlainToTLS is, with fence.ErrUnauthenticated in a call's error, so
// that a caller can say which of its settings fixes it.
var (
	// ErrTLSToPlain: the call was TLS, and the node serves plain HTTP.
	ErrTLSToPlain = errors.New("the call was TLS, and the node serves plain HTTP")
	// ErrUnknownAuthority: the node's certificate is not signed by a CA
	// the client trusts.
	ErrUnknownAuthority = errors.New("the node's certificate is not signed by a CA the client trusts")
	// ErrCertificateName: the node's certificate is not for the name or
	// address the client called.
	ErrCertificateName = errors.New("the node's certificate is not for the address called")
	// ErrCertificateRequired: the node requires a client certificate, and
	// the client sent none (Go's client sends one only when a CA the node
	// trusts signed it).
	ErrCertificateRequired = errors.New("the node requires a client certificate")
	// ErrCertificateRefused: the node refused the client's certificate
	// (expired, revoked, of a CA it does not trust).
	ErrCertificateRefused = errors.New("the node refused the client certificate")
)

// RemoteError is an error the service returned. It wraps the fence sentinel
// named by the error's reason (or by its code, for peers that send none).
type RemoteError struct {
	// Code is the Connect/gRPC status code.
	Code connect.Code
	// Message is the server's message, meant for people.
	Message string
	// Detail is the structured detail, when the server sent one.
	Detail   *fencev1.ErrorDetail
	sentinel error
}

func (e *RemoteError) Error() string { return e.Message }

// Unwrap returns the fence sentinel, so errors.Is(err, fence.ErrLocked) works.
func (e *RemoteError) Unwrap() error { return e.sentinel }

// FromConnect converts an error returned by a Connect client call. Errors
// that are not Connect errors are returned as they are; Unavailable and
// transport failures wrap fence.ErrUnavailable.
func FromConnect(err error) error {
	if err == nil {
		return nil
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	re := &RemoteError{Code: ce.Code(), Message: ce.Message()}
	if ce.Code() == connect.CodeCanceled && connectionLost(err) {
		// connect-go reports a connection reset (or a write to a closed
		// one) as Canceled, even on a client whose context is live: a
		// node that crashed mid-call. That is a transport failure, to be
		// retried elsewhere like any other.
		re.Code = connect.CodeUnavailable
	}
	if errors.Is(err, ErrPlainToTLS) {
		re.Code = connect.CodeUnauthenticated
		re.sentinel = fmt.Errorf("%w: %w", fence.ErrUnauthenticated, ErrPlainToTLS)
	}
	if ce.Code() == connect.CodeUnavailable && tlsFailure(err) {
		// A certificate one side refuses will be refused again: fail now,
		// rather than retry as for a node that is down.
		re.Code = connect.CodeUnauthenticated
		re.Message = "TLS with the node failed: " + re.Message
		if kind := tlsFailureKind(err); kind != nil {
			re.sentinel = fmt.Errorf("%w: %w", fence.ErrUnauthenticated, kind)
		}
	}
	re.Detail = ErrorDetailOf(ce)
	return re.withSentinel()
}

// ErrorDetailOf returns the ErrorDetail a Connect error carries (the last,
// should a peer send several), or nil when it carries none: a peer that is
// not a fence node, or a failure of the transport.
func ErrorDetailOf(ce *connect.Error) *fencev1.ErrorDetail {
	var found *fencev1.ErrorDetail
	for _, d := range ce.Details() {
		if v, err := d.Value(); err == nil {
			if detail, ok := v.(*fencev1.ErrorDetail); ok {
				found = detail
			}
		}
	}
	return found
}

// FromStream converts an operation's error answered on a stream, as
// FromConnect converts a unary call's: the result wraps the same sentinel.
func FromStream(se *fencev1.StreamError) error {
	if se == nil {
		return nil
	}
	re := &RemoteError{Code: connect.Code(se.GetCode()), Message: se.GetMessage(), Detail: se.GetDetail()}
	return re.withSentinel()
}

// withSentinel sets the sentinel the error's reason (or code) names.
func (re *RemoteError) withSentinel() *RemoteError {
	if re.Detail != nil {
		for _, row := range table {
			if row.reason == re.Detail.GetReason() {
				re.sentinel = row.sentinel
			}
		}
		switch re.sentinel {
		case fence.ErrStaleToken:
			re.sentinel = &fence.StaleTokenError{Key: re.Detail.GetLock(), Token: re.Detail.GetToken(), Highest: re.Detail.GetCurrentToken()}
		case fence.ErrLocked:
			re.sentinel = &fence.LockedError{Lock: re.Detail.GetLock(), HolderSession: re.Detail.GetHolderSessionId(), HolderToken: re.Detail.GetHolderToken(),
				Reason: strings.TrimPrefix(re.Message, fence.ErrLocked.Error()+": ")}
		}
	}
	if re.sentinel == nil {
		re.sentinel = sentinelForCode(re.Code)
	}
	return re
}

// connectionLost reports whether err is the connection being reset or
// closed under the call, as when the node at the other end is killed.
func connectionLost(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func sentinelForCode(code connect.Code) error {
	switch code {
	case connect.CodeCanceled:
		return context.Canceled
	case connect.CodeDeadlineExceeded:
		return context.DeadlineExceeded
	case connect.CodeUnavailable:
		return fence.ErrUnavailable
	case connect.CodeInvalidArgument:
		return fence.ErrInvalidArgument
	case connect.CodeNotFound:
		return fence.ErrSessionNotFound
	case connect.CodeResourceExhausted:
		return fence.ErrLimit
	case connect.CodeUnauthenticated:
		return fence.ErrUnauthenticated
	case connect.CodePermissionDenied:
		return fence.ErrPermissionDenied
	case connect.CodeUnimplemented:
		// A node of a version without the call.
		return fence.ErrUnsupported
	}
	return nil
}

// tlsFailure reports whether err is a failed TLS handshake: a certificate
// one side does not accept, or TLS against a port that does not speak it.
func tlsFailure(err error) bool {
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	var op *net.OpError
	return errors.As(err, &verify) || errors.As(err, &header) || errors.Is(err, http.ErrSchemeMismatch) ||
		(errors.As(err, &op) && op.Op == "remote error" && strings.HasPrefix(op.Err.Error(), "tls: "))
}

// TLS alerts a node sends a client whose certificate it does not accept
// (RFC 8446, section 6).
const (
	alertBadCertificate         tls.AlertError = 42
	alertUnsupportedCertificate tls.AlertError = 43
	alertCertificateRevoked     tls.AlertError = 44
	alertCertificateExpired     tls.AlertError = 45
	alertCertificateUnknown     tls.AlertError = 46
	alertUnknownCA              tls.AlertError = 48
	alertCertificateRequired    tls.AlertError = 116
)

// tlsFailureKind is which of the TLS failures err is, or nil. crypto/tls
// reports an alert from the other side as a net.OpError of an unexported
// type, whose text is that of the exported tls.AlertError of the same
// code.
func tlsFailureKind(err error) error {
	var unknown x509.UnknownAuthorityError
	var name x509.HostnameError
	var header tls.RecordHeaderError
	var op *net.OpError
	switch {
	case errors.As(err, &unknown):
		return ErrUnknownAuthority
	case errors.As(err, &name):
		return ErrCertificateName
	case errors.Is(err, http.ErrSchemeMismatch), errors.As(err, &header):
		return ErrTLSToPlain
	case errors.As(err, &op) && op.Op == "remote error":
		switch op.Err.Error() {
		case alertCertificateRequired.Error():
			return ErrCertificateRequired
		case alertBadCertificate.Error(), alertUnsupportedCertificate.Error(), alertCertificateRevoked.Error(),
			alertCertificateExpired.Error(), alertCertificateUnknown.Error(), alertUnknownCA.Error():
			return ErrCertificateRefused
		}
	}
	return nil
}

// Package wireerr ties the project's sentinel errors to the contract's
// ErrorCode and produces the sanitized text a peer sees.
//
// Every package that can refuse work declares its sentinels with New, naming
// the ErrorCode the refusal maps to. Errors travel through the engine as
// ordinary Go errors (wrapped, compared with errors.Is); only the edge calls
// internal/sharderr, which makes the contract's ShardError from Describe, so
// the mapping lives in one place. wireerr itself imports no generated code:
// the scheduler's pure core (engine/sched) and the session store use it
// without linking gRPC, so codes are the contract's numbers (Code), pinned
// to the generated enum by a test. The detail a peer sees is
// built from the sentinel's fixed text plus a detail formatted by our own code
// (numbers, enum names): never a raw library or C error, a path or a secret.
package wireerr

import (
	"context"
	"errors"
	"fmt"
)

// Code is a contract ErrorCode's number (meshnet.shard.v1.ErrorCode).
type Code int32

// The contract's error codes (shard_runtime.proto), for packages that do
// not import the generated code; TestCodesMatchContract pins them.
const (
	CodeUnspecified         Code = 0
	CodeSchemaUnsupported   Code = 1
	CodeFingerprintMismatch Code = 2
	CodeEpochStale          Code = 3
	CodeShardRangeMismatch  Code = 4
	CodeCacheMiss           Code = 5
	CodeResourceExhausted   Code = 6
	CodePayloadCorrupt      Code = 7
	CodeCancelled           Code = 8
	CodeDeadlineExceeded    Code = 9
	CodeFlowControl         Code = 10
	CodeInternal            Code = 11
)

// Error is a sentinel with the contract code it maps to. Its text is fixed and
// operator-safe.
type Error struct {
	code      Code
	retryable bool
	msg       string
}

// New declares a sentinel. msg must carry a package prefix ("reassemble: ...")
// and must not contain anything a peer must not see. code is a Code or the
// generated ErrorCode.
func New[C ~int32](code C, msg string) *Error {
	return &Error{code: Code(code), msg: msg}
}

// NewRetryable declares a sentinel for a refusal that may be retried unchanged
// (the contract's ShardError.retryable).
func NewRetryable[C ~int32](code C, msg string) *Error {
	return &Error{code: Code(code), retryable: true, msg: msg}
}

func (e *Error) Error() string { return e.msg }

// detailed adds a safe, formatted detail to a sentinel and optionally keeps an
// unsafe cause for local logs only.
type detailed struct {
	sentinel *Error
	detail   string
	cause    error
}

func (d *detailed) Error() string {
	if d.cause != nil {
		return d.sentinel.msg + ": " + d.detail + " (" + d.cause.Error() + ")"
	}
	return d.sentinel.msg + ": " + d.detail
}

func (d *detailed) Unwrap() []error {
	if d.cause != nil {
		return []error{d.sentinel, d.cause}
	}
	return []error{d.sentinel}
}

// Errorf returns an error that is sentinel (errors.Is holds) with a detail
// formatted from format and args. Only pass values the project produced
// itself (counts, offsets, enum names): the result reaches peers.
func Errorf(sentinel *Error, format string, args ...any) error {
	return &detailed{sentinel: sentinel, detail: fmt.Sprintf(format, args...)}
}

// Wrap returns an error that is sentinel, with cause kept for local logs only:
// the peer sees the sentinel's text and never the cause's.
func Wrap(sentinel *Error, cause error) error {
	return &detailed{sentinel: sentinel, detail: "see worker log", cause: cause}
}

// Internal is the code of any error that carries no sentinel.
var Internal = New(CodeInternal, "internal error")

// Cancelled and Expired are what a context's end without a sentinel maps
// to: the peer went away or its deadline passed while the work waited, which
// is not a fault of the worker (the soak saw a session open end so as
// INTERNAL).
var (
	Cancelled = New(CodeCancelled, "cancelled")
	Expired   = New(CodeDeadlineExceeded, "deadline exceeded")
)

// unsentineled is the sentinel an error without one maps to.
func unsentineled(err error) *Error {
	switch {
	case errors.Is(err, context.Canceled):
		return Cancelled
	case errors.Is(err, context.DeadlineExceeded):
		return Expired
	}
	return Internal
}

// CodeOf returns the contract code for err: the code of the first sentinel in
// its chain, CANCELLED or DEADLINE_EXCEEDED for a context's end, or
// INTERNAL.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.code
	}
	return unsentineled(err).code
}

// maxDetail bounds the detail a peer receives.
const maxDetail = 256

// Describe is what a peer may see of err: its code, whether it may be
// retried unchanged, and a sanitized detail of at most 256 bytes. Errors
// without a sentinel become INTERNAL with a fixed text: their raw text stays
// local.
func Describe(err error) (code Code, retryable bool, detail string) {
	var d *detailed
	var e *Error
	switch {
	case errors.As(err, &d):
		code, retryable, detail = d.sentinel.code, d.sentinel.retryable, d.sentinel.msg+": "+d.detail
	case errors.As(err, &e):
		code, retryable, detail = e.code, e.retryable, e.msg
	default:
		u := unsentineled(err)
		code, retryable, detail = u.code, u.retryable, u.msg
	}
	if len(detail) > maxDetail {
		detail = detail[:maxDetail]
	}
	return code, retryable, detail
}

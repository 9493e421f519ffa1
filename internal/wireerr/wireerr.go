// Package wireerr ties the project's sentinel errors to the contract's
// ErrorCode and produces the sanitized ShardError a peer sees.
//
// Every package that can refuse work declares its sentinels with New, naming
// the ErrorCode the refusal maps to. Errors travel through the engine as
// ordinary Go errors (wrapped, compared with errors.Is); only the edge calls
// ToShardError, so the mapping lives in one place. The detail a peer sees is
// built from the sentinel's fixed text plus a detail formatted by our own code
// (numbers, enum names): never a raw library or C error, a path or a secret.
package wireerr

import (
	"context"
	"errors"
	"fmt"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Error is a sentinel with the contract code it maps to. Its text is fixed and
// operator-safe.
type Error struct {
	code      shardv1.ErrorCode
	retryable bool
	msg       string
}

// New declares a sentinel. msg must carry a package prefix ("reassemble: ...")
// and must not contain anything a peer must not see.
func New(code shardv1.ErrorCode, msg string) *Error {
	return &Error{code: code, msg: msg}
}

// NewRetryable declares a sentinel for a refusal that may be retried unchanged
// (the contract's ShardError.retryable).
func NewRetryable(code shardv1.ErrorCode, msg string) *Error {
	return &Error{code: code, retryable: true, msg: msg}
}

func (e *Error) Error() string { return e.msg }

// Code is the contract ErrorCode of this sentinel.
func (e *Error) Code() shardv1.ErrorCode { return e.code }

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
var Internal = New(shardv1.ErrorCode_ERROR_CODE_INTERNAL, "internal error")

// Cancelled and Expired are what a context's end without a sentinel maps
// to: the peer went away or its deadline passed while the work waited, which
// is not a fault of the worker (the soak saw a session open end so as
// INTERNAL).
var (
	Cancelled = New(shardv1.ErrorCode_ERROR_CODE_CANCELLED, "cancelled")
	Expired   = New(shardv1.ErrorCode_ERROR_CODE_DEADLINE_EXCEEDED, "deadline exceeded")
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
// ERROR_CODE_INTERNAL.
func CodeOf(err error) shardv1.ErrorCode {
	var e *Error
	if errors.As(err, &e) {
		return e.code
	}
	return unsentineled(err).code
}

// maxDetail bounds the detail a peer receives.
const maxDetail = 256

// ToShardError converts err into the sanitized wire error. Errors without a
// sentinel become INTERNAL with a fixed text: their raw text stays local.
func ToShardError(err error) *shardv1.ShardError {
	if err == nil {
		return nil
	}
	var d *detailed
	var e *Error
	out := &shardv1.ShardError{}
	switch {
	case errors.As(err, &d):
		out.Code, out.Retryable = d.sentinel.code, d.sentinel.retryable
		out.Detail = d.sentinel.msg + ": " + d.detail
	case errors.As(err, &e):
		out.Code, out.Retryable, out.Detail = e.code, e.retryable, e.msg
	default:
		u := unsentineled(err)
		out.Code, out.Retryable, out.Detail = u.code, u.retryable, u.msg
	}
	if len(out.Detail) > maxDetail {
		out.Detail = out.Detail[:maxDetail]
	}
	return out
}

// Package sharderr makes the contract's ShardError from the project's
// errors (internal/wireerr): the one place where a refusal becomes what a
// peer reads.
package sharderr

import (
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
)

// From converts err into the sanitized wire error (nil for nil). Errors
// without a sentinel become INTERNAL with a fixed text: their raw text stays
// local.
func From(err error) *shardv1.ShardError {
	if err == nil {
		return nil
	}
	code, retryable, detail := wireerr.Describe(err)
	return &shardv1.ShardError{Code: shardv1.ErrorCode(code), Retryable: retryable, Detail: detail}
}

// Code is err's contract ErrorCode (wireerr.CodeOf).
func Code(err error) shardv1.ErrorCode { return shardv1.ErrorCode(wireerr.CodeOf(err)) }

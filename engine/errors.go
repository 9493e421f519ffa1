package engine

import (
	"github.com/meshnet/shardd/engine/sched"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/wireerr"
)

const (
	codeSchema      = shardv1.ErrorCode_ERROR_CODE_SCHEMA_UNSUPPORTED
	codeFingerprint = shardv1.ErrorCode_ERROR_CODE_FINGERPRINT_MISMATCH
	codeRange       = shardv1.ErrorCode_ERROR_CODE_SHARD_RANGE_MISMATCH
	codeExhausted   = shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED
	codeCorrupt     = shardv1.ErrorCode_ERROR_CODE_PAYLOAD_CORRUPT
	codeFlow        = shardv1.ErrorCode_ERROR_CODE_FLOW_CONTROL_VIOLATION
)

// Refusals produced by the engine. Stage, store and backend sentinels carry
// their own codes.
var (
	ErrSchema         = wireerr.New(codeSchema, "engine: schema version not supported")
	ErrBundleVersion  = wireerr.New(codeSchema, "engine: tensor bundle version not supported")
	ErrFingerprint    = wireerr.New(codeFingerprint, "engine: fingerprint differs from the one this worker serves")
	ErrIdentity       = wireerr.New(codeFingerprint, "engine: envelope identity differs from the session opened on this stream")
	ErrRange          = wireerr.New(codeRange, "engine: shard range differs from the range this worker serves")
	ErrEffectiveStart = wireerr.New(codeRange, "engine: cannot execute from this effective_start_layer")
	ErrCacheMiss      = sched.ErrCacheMiss
	ErrNoSession      = wireerr.NewRetryable(codeExhausted, "engine: no session slot is free")
	ErrDraining       = wireerr.NewRetryable(codeExhausted, "engine: worker is draining and accepts no new sessions")
	ErrQueueFull      = wireerr.NewRetryable(codeExhausted, "engine: work queue is full")
	ErrHandoff        = wireerr.NewRetryable(codeExhausted, "engine: worker is draining and hands its sessions to a standby")
	ErrCancelled      = sched.ErrCancelled
	ErrDeadline       = sched.ErrDeadline
	ErrCredit         = wireerr.New(codeFlow, "engine: sender exceeded its granted credit")
	ErrChunkTokens    = wireerr.New(codeFlow, "engine: prefill chunk exceeds max_prefill_chunk_tokens")
	ErrChunkBytes     = wireerr.New(codeFlow, "engine: message exceeds max_chunk_bytes")
	ErrNotOpen        = wireerr.New(codeSchema, "engine: the stream must open with SessionOpen")
	ErrReopen         = wireerr.New(codeSchema, "engine: SessionOpen sent twice on one stream")
	ErrEnvelope       = sched.ErrEnvelope
	ErrUnknownTensor  = wireerr.New(codeCorrupt, "engine: unknown boundary tensor")
	ErrMissingTensor  = wireerr.New(codeCorrupt, "engine: required boundary tensor missing")
	ErrTensorShape    = wireerr.New(codeCorrupt, "engine: boundary tensor does not fit the model")
	ErrTokenRange     = wireerr.New(codeCorrupt, "engine: token id outside the vocabulary")
	ErrForward        = wireerr.NewRetryable(shardv1.ErrorCode_ERROR_CODE_INTERNAL, "engine: the forward pass failed")
	ErrKVFull         = wireerr.NewRetryable(codeExhausted, "engine: backend KV cache is full")
)

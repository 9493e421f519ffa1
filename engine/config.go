package engine

import (
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshnet/shardd/backend"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// IdlePoller keeps CPUs busy for a while after each Extend
// (internal/idlepoll).
type IdlePoller interface {
	Extend()
	Spun() time.Duration
}

// Config holds the worker's admission budgets and scheduling knobs.
type Config struct {
	// MaxSessions: route sessions holding KV state at once.
	MaxSessions int
	// Exact: a session's numbers are bitwise those it would get
	// alone, whatever else is batched. Decode forwards carry every ready
	// session's step, prefill forwards prompt chunks of one length, each
	// whole. The
	// backend must give each session a KV stream of its own
	// (llamacpp.Config.SeparateKV), where its cells lie in position order,
	// and its forward must be batch-invariant (the sgemm patch). It is
	// part of the recipe.
	Exact bool
	// SessionTTL: an idle session's state is dropped after this long.
	SessionTTL time.Duration
	// EvictGrace: a session used within this long keeps its state when
	// another needs its slot or KV tokens; the other is refused
	// (RESOURCE_EXHAUSTED, retryable). 0: 2s; negative: any idle session
	// may be evicted.
	EvictGrace time.Duration
	// MaxQueue: work items queued or running across all streams; more is
	// RESOURCE_EXHAUSTED.
	MaxQueue int
	// DrainHandoff: once draining, refuse every further step of the open
	// sessions too (ErrHandoff, retryable RESOURCE_EXHAUSTED; Health says
	// DRAINING), so that heads with a standby for this hop move them there
	// (route failover) and the drain ends as soon as their streams close,
	// instead of when their generations finish here.
	DrainHandoff bool
	// IterationTokens: the least token budget of one scheduler iteration
	// while a decode step waits: decode rows first, prefill tokens fill
	// the rest. The decode budget (below) usually grants more.
	IterationTokens int
	// DecodeBudget: the time an iteration that carries decode rows may
	// take. Decode rows go first; prefill tokens are added while the cost
	// model (forward time against rows, measured online) predicts the
	// forward stays within it, each priced at the model's cost per row (or
	// at what a prefill row was measured to add beside decode rows, if
	// more) on top of the decode rows' own time. 0: 1.5x the measured time of the
	// decode rows alone, so prefill may slow a decode step by half.
	// Negative: no time budget, IterationTokens only.
	DecodeBudget time.Duration
	// PrefillIterationTokens: the budget of a prefill-only iteration while no
	// session is decoding, and of the prompt tokens of any iteration while a
	// crowd of prompts of at most this many tokens, or their chunks, waits
	// (two or more, over two thirds as many as the sessions decoding).
	// Larger is better prefill throughput, and longer decode steps beside
	// a crowd.
	PrefillIterationTokens int
	// DecodeQuiet: for this long after a decode step ran, prefill-only
	// iterations keep the small IterationTokens budget, since another
	// decode step is likely on its way and must not wait behind a long
	// iteration. Cover the time a step takes to come back around the route.
	DecodeQuiet time.Duration
	// DecodeGroups: a decode iteration waits (up to GatherWindow) until
	// this share of the decoding sessions, 1/DecodeGroups rounded down
	// (the smaller group when the count is odd), has its step queued, so
	// the sessions move in that many groups; set it to the route's stage
	// count so every stage computes at once. Above 1, an iteration also
	// takes no more than that share rounded up of the decode steps (the
	// earliest first), so uneven groups even out, and a session whose
	// prompt just completed counts as decoding (a burst of prompts forms
	// whole groups), until a hold waits for it in vain. 0: 1 on a worker
	// that holds the whole model (one batch of every decoding session),
	// 2 on a shard. Negative: no waiting, an iteration starts with what
	// has arrived.
	DecodeGroups int
	// GatherWindow bounds that wait; 0: half the cost model's predicted
	// time of the batch waited for.
	GatherWindow time.Duration
	// Flow control this worker offers; a session gets the smaller of these
	// and what the initiator proposes.
	MaxInflightChunks     uint32
	MaxChunkBytes         uint64
	MaxPrefillChunkTokens uint32
	// MaxTensorBytes bounds one received tensor.
	MaxTensorBytes uint64
	// RequireChecksum refuses tensors without a CRC32C.
	RequireChecksum bool
	// Boundary is the dtype of hidden states this worker sends (bf16 is the
	// contract's canonical choice; f32 is exact).
	Boundary shardv1.DType
	// PrefixCacheBytes bounds the prefix cache (sched/prefix.go): KV cells and
	// output rows of prompt prefixes this shard computed, found again by
	// content. 0: the default, 256 MiB; negative: no cache.
	PrefixCacheBytes int64
	// Withhold names optional behaviours (internal/feature) this worker
	// neither advertises nor accepts, as a worker of an earlier release:
	// their tensors are refused as unknown.
	Withhold []string
	// PrefixBlock is the prefix cache's block, in positions: a prompt's
	// prefix is found again in whole blocks. 0: 32.
	PrefixBlock int
	// ResultsCacheBytes bounds the cached results that answer duplicate
	// steps.
	ResultsCacheBytes int64
	// Version is reported as recipe_version.
	Version string
	// IdlePoll keeps the forward's CPUs from going idle between forwards:
	// the driver calls Extend after each (idlepoll.Poller, --idle-poll),
	// and Spun is a metric. nil: none.
	IdlePoll IdlePoller
	// TracerProvider and MeterProvider turn on spans per stage and metrics;
	// nil leaves the engine uninstrumented (nothing is timed).
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Defaults fills zero fields.
func (c Config) Defaults() Config {
	set := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	set(&c.MaxSessions, 16)
	set(&c.MaxQueue, 256)
	set(&c.IterationTokens, 4)
	set(&c.PrefillIterationTokens, 128)
	if c.DecodeQuiet == 0 {
		c.DecodeQuiet = 250 * time.Millisecond
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = 10 * time.Minute
	}
	if c.EvictGrace == 0 {
		c.EvictGrace = 2 * time.Second
	}
	if c.MaxInflightChunks == 0 {
		c.MaxInflightChunks = 8
	}
	if c.MaxChunkBytes == 0 {
		c.MaxChunkBytes = 8 << 20
	}
	if c.MaxPrefillChunkTokens == 0 {
		c.MaxPrefillChunkTokens = 512
	}
	if c.MaxTensorBytes == 0 {
		c.MaxTensorBytes = c.MaxChunkBytes
	}
	if c.Boundary == shardv1.DType_DTYPE_UNSPECIFIED {
		c.Boundary = shardv1.DType_DTYPE_BFLOAT16
	}
	if c.PrefixCacheBytes == 0 {
		c.PrefixCacheBytes = 256 << 20
	}
	if c.PrefixBlock <= 0 {
		c.PrefixBlock = 32
	}
	if c.ResultsCacheBytes == 0 {
		c.ResultsCacheBytes = 64 << 20
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	return c
}

// forBackend settles what depends on the backend serving the config.
func (c Config) forBackend(info backend.Info) Config {
	if c.MaxSessions > info.MaxSeqs-1 {
		c.MaxSessions = info.MaxSeqs - 1 // one sequence is kept for stateless work
	}
	if c.DecodeGroups == 0 {
		c.DecodeGroups = 2
		if info.TokensIn && info.LogitsOut {
			c.DecodeGroups = 1 // the whole model: no other stage to overlap with
		}
	}
	return c
}

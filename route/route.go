// Package route is the head side of a route: it drives a generation through
// a chain of shardd workers over the Shard data plane.
//
// A Route holds one gRPC connection per direct hop (a relayed hop opens a
// frame connection per stream and per call: see transport.go) and checks,
// before any work, that the hops are validated, serve the same model, and
// tile the layers from 0 with no gap; their runtime recipes may differ
// (Route.Mixed). Each Generate opens one Session stream per hop,
// sends the prompt as bounded prefill chunks, pipelined through the hops
// (pipeline.go), passes each hop's output tensor
// to the next hop unchanged (it is already framed and checksummed), decodes
// through the DecodeStep fast path and samples at the head. A step's output
// is used as soon as it arrives; its Ack, which a worker sends after the
// output, is read at the next exchange on that hop when the granted window
// allows two un-acked steps, and at the end of the generation.
//
// Failures: a transport error on a hop reopens that hop's stream and resends
// the same step with the same idempotency step (a worker that had applied it
// answers with the cached result, marked duplicate). A CACHE_MISS anywhere,
// for example from a worker that restarted and lost its state, is recovered
// by one full re-prefill of everything fed so far under the same route
// session id. A hop whose worker is gone moves to a standby
// (Options.Alternates or Options.Replace), which alone replays the
// session: failover.go. Many generations may run on one Route at once.
//
// Files, by what they own:
//   - route.go: Options, Dial, the hops and the checks that they tile one model;
//   - generate.go: a generation's loop (prefill chunks, decode steps, sampling);
//   - pipeline.go: a prompt's chunks through the hops as a pipeline;
//   - hop.go: the exchange with one hop (framing, send, output and Ack, release);
//   - output.go: checking each hop's output and decoding the last hop's logits;
//   - retry.go: busy refusals, recipe changes and CACHE_MISS rebuilds;
//   - failover.go and standby.go: moving a hop to a standby, and where
//     standbys come from;
//   - sample.go: the head's sampler; transport.go: relayed (frame) hops.
package route

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/stages/decode"
)

// Options tune a Route.
type Options struct {
	// StepTimeout bounds one step on one hop; it is carried in-band as the
	// envelope deadline. Default 60s.
	StepTimeout time.Duration
	// PrefillChunk is the most tokens per prefill chunk; 0 means the
	// smallest max_prefill_chunk_tokens the hops grant, at most 128 while
	// the route has not returned hidden states yet and then at most 512
	// and what keeps a chunk of hidden states within every hop's
	// max_chunk_bytes.
	PrefillChunk int
	// PipelineChunks: on a route of more than one hop, a prompt of
	// several chunks goes through the hops as a pipeline: hop i+1 runs a
	// chunk while hop i runs the next. Above 1, every prompt is cut into
	// this many chunks at least (a token each when shorter); 0 and 1 keep
	// the chunks of PrefillChunk. Cut, a long prompt's first token comes
	// sooner (512 tokens on 2 hops: 1.4x), and sessions that start
	// together keep every hop busy through their prompts (32 sessions of
	// 8-token prompts: 1-3% more tokens/s, within the noise: "Pipeline" in
	// PERF.md). The cost: a prompt's rows computed in smaller batches,
	// whose last bits differ from a whole prompt's outside --exact.
	// Negative: each chunk goes through every hop before the next is sent.
	PipelineChunks int
	// Retries per step per hop after a transport error. Default 3.
	Retries int
	// BusyTimeout bounds how long a generation without a deadline of its
	// own rides out a full worker: a refusal the contract marks retryable
	// (RESOURCE_EXHAUSTED: no session slot, no KV room) is retried, the
	// same step or open again, after a backoff with jitter (10 ms doubling
	// to 1 s), until the generation's deadline or, without one, this long
	// after the first refusal in a row. Default 5 minutes.
	BusyTimeout time.Duration
	// ReplayRecovery rebuilds a session a worker lost (a CACHE_MISS, e.g.
	// after a restart) in the shapes it was built in: the prompt in its
	// chunks, then each generated token as a decode step of its own,
	// instead of one prefill of the whole sequence. With workers in
	// --exact mode the tokens after a recovery are then those of
	// an uninterrupted run; it costs a round trip per generated token.
	ReplayRecovery bool
	// CompactLogits asks the last hop, in each unit of work, for the best
	// K logits of a row and their token ids instead of the whole row (the
	// logits_top_k tensor; engine.parseTopK), where sampling needs no more:
	// K = 1 for greedy, k for top-k sampling (Sampling.Compact). The tokens
	// are exactly those of the whole row. A generation that samples over
	// the whole vocabulary (temperature without top-k) or watches
	// Request.Logits gets whole rows as before. A worker that predates it
	// refuses the tensor (PAYLOAD_CORRUPT, unknown tensor).
	CompactLogits bool
	// TLS, when set, secures every hop's connection (see
	// internal/tlsconf); nil is plaintext.
	TLS *tls.Config
	// DialOptions are added to the defaults.
	DialOptions []grpc.DialOption
	// TracerProvider, when set, makes each generation the parent span of
	// one trace through every hop: a client span per hop stream, whose W3C
	// trace context travels in the stream's metadata.
	TracerProvider trace.TracerProvider
	// Alternates are standby workers per hop (Alternates[i] for hop i, in
	// order of preference): a hop whose worker fails is replaced by the
	// first of them that serves it (failover.go). Replace, when set, is
	// asked instead.
	Alternates [][]string
	Replace    Replacer
	// Observe, when set, is told of every step a hop acknowledged (not
	// duplicates): wall is the head's time from sending the step to its
	// output (or Ack), exec the worker's execution_nanos. It is called on
	// one of the generation's goroutines, from many generations at once,
	// and must not block.
	Observe func(StepSample)
}

// StepSample is one acknowledged step on one hop.
type StepSample struct {
	Hop        int
	Decode     bool // a decode step (else a prefill chunk)
	Wall, Exec time.Duration
}

// Hop is one worker of the route.
type Hop struct {
	Addr string
	// Capability is the worker's report when the route was dialled; Current
	// is the latest (a worker restarted on the same address may run
	// another build).
	Capability *shardv1.CapabilityReport
	current    atomic.Pointer[hopState]
	// rowBytes is the size of one row of the hidden states this hop
	// returned (0: none yet), which bounds the next hop's chunks.
	rowBytes atomic.Int64
	conn     *grpc.ClientConn // nil for a frame hop (relayed or direct)
	client   shardv1.ShardRuntimeClient
}

// hopState is what a hop's latest capability report says.
type hopState struct {
	cap      *shardv1.CapabilityReport
	features feature.Set // the optional behaviours it advertises
}

func newHopState(c *shardv1.CapabilityReport) *hopState {
	return &hopState{cap: c, features: feature.Parse(c.GetDetail())}
}

// Current is the hop's latest capability report.
func (h *Hop) Current() *shardv1.CapabilityReport { return h.current.Load().cap }

// Features are the optional behaviours the hop's latest report advertises
// (internal/feature): the head sends their tensors only to a hop that
// understands them, so heads and workers of different releases mix.
func (h *Hop) Features() feature.Set { return h.current.Load().features }

// Recipe is the hop's runtime recipe, one line per key=value, as its latest
// report gives it (the report's backend field).
func (h *Hop) Recipe() string { return h.Current().GetBackend() }

// capability asks the hop for its report, within the step timeout.
func (h *Hop) capability(ctx context.Context, timeout time.Duration) (*shardv1.CapabilityReport, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := h.client.GetCapability(cctx, &shardv1.CapabilityRequest{SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1})
	if err != nil {
		if ctx.Err() == nil && cctx.Err() == context.DeadlineExceeded {
			return nil, fmt.Errorf("%w: %s did not answer within %v: %s", ErrUnreachable, h.Addr, timeout, status.Convert(err).Message())
		}
		return nil, fmt.Errorf("route: %s: capability: %w", h.Addr, err)
	}
	return c, nil
}

// Mixed reports whether the hops run more than one runtime recipe (other
// builds, instruction sets or devices). A route of mixed recipes
// generates, but the guarantees that compare bits across hops (a split
// equal to the whole model run in one process, bitwise recovery onto
// another worker) hold only where the recipes are equal: README,
// "Building for a fleet".
func (r *Route) Mixed() bool {
	for _, h := range r.Hops {
		if h.Current().GetFingerprint().GetRuntimeRecipeDigest() != r.Hops[0].Current().GetFingerprint().GetRuntimeRecipeDigest() {
			return true
		}
	}
	return false
}

// Route is a chain of workers that together hold every layer of a model.
type Route struct {
	// Hops are the workers the route was dialled with; a failover puts
	// another in a failed one's place for the generations after it
	// (Current).
	Hops []*Hop
	opts Options
	mu   sync.Mutex // guards cur, failed and dialled
	// cur are the hops new generations use (copy on write).
	cur []*Hop
	// failed are the addresses whose workers failed, and when.
	failed map[string]time.Time
	// pool holds a hop per address connected (the route's and the
	// standbys'), reused when a failover returns to an address, and closed
	// with the route: connections stay bounded by the addresses.
	pool map[string]*Hop
}

// Current is the route's hops now: those dialled, with failed ones
// replaced.
func (r *Route) Current() []*Hop { return r.current() }

// Errors a caller can classify.
var (
	ErrRoute    = errors.New("route: hops do not form a route")
	ErrRefused  = errors.New("route: a worker refused the work")
	ErrResponse = errors.New("route: a worker's response is unusable")
	// ErrUnreachable: a hop did not answer within the step timeout.
	ErrUnreachable = errors.New("route: worker unreachable")
	// ErrStateLost: a worker kept dropping the session's state (a declared
	// CACHE_MISS, e.g. evicted for a newer session) faster than the head
	// could rebuild it; see maxRebuilds.
	ErrStateLost = errors.New("route: a worker kept dropping the session's state")
	// ErrRecipeChanged: with Options.ReplayRecovery, a hop came back with
	// another runtime recipe, so the generation cannot go on bitwise.
	ErrRecipeChanged = errors.New("route: a worker came back with another runtime recipe; bitwise recovery is impossible")
	errCacheMiss     = errors.New("route: cache miss")
)

// maxRebuilds bounds the re-prefills in a row that one step may take after
// cache misses: a worker short of slots or KV can evict a session between
// the chunks of its prefill, and again during the rebuild.
const maxRebuilds = 3

// Dial connects to every hop (addresses as in transport.go) and checks that they form a route.
func Dial(ctx context.Context, addrs []string, opts Options) (*Route, error) {
	if opts.StepTimeout == 0 {
		opts.StepTimeout = 60 * time.Second
	}
	if opts.Retries == 0 {
		opts.Retries = 3
	}
	if opts.BusyTimeout == 0 {
		opts.BusyTimeout = 5 * time.Minute
	}
	r := &Route{opts: opts, failed: map[string]time.Time{}, pool: map[string]*Hop{}}
	for _, addr := range addrs {
		h, err := r.dialHop(ctx, addr, opts.StepTimeout)
		if h != nil {
			r.Hops = append(r.Hops, h)
			r.pool[addr] = h
		}
		if err != nil {
			r.Close()
			return nil, err
		}
	}
	r.cur = slices.Clone(r.Hops)
	r.dialStandbys(ctx)
	if err := r.check(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

// connect makes a client for the worker at addr (no call yet).
func (r *Route) connect(addr string) (*Hop, error) {
	const recvWindow = 16 << 20
	creds := insecure.NewCredentials()
	if r.opts.TLS != nil {
		creds = credentials.NewTLS(r.opts.TLS)
	}
	dial := append([]grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// Windows that take a whole result (a last hop's logits are
		// 4 x vocab bytes per token) without a WINDOW_UPDATE round trip;
		// gRPC's default starts at 64 KiB.
		grpc.WithInitialWindowSize(recvWindow), grpc.WithInitialConnWindowSize(2 * recvWindow),
		grpc.WithWriteBufferSize(256 << 10), grpc.WithReadBufferSize(256 << 10),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(decode.Codec{Pool: bufpool.Default}),
			grpc.MaxCallRecvMsgSize(maxResponseBytes), grpc.MaxCallSendMsgSize(maxResponseBytes),
			// A hop that restarts comes back on the same address: wait for
			// it (bounded by the step's context) instead of failing at once.
			grpc.WaitForReady(true)),
	}, r.opts.DialOptions...)
	h := &Hop{Addr: addr}
	fc, err := frameClient(addr, r.opts.TLS)
	if err != nil {
		return nil, err
	}
	if fc != nil {
		h.client = fc
		return h, nil
	}
	if h.conn, err = grpc.NewClient(addr, dial...); err != nil {
		return nil, fmt.Errorf("route: %s: %w", addr, err)
	}
	h.client = shardv1.NewShardRuntimeClient(h.conn)
	return h, nil
}

// dialHop connects to the worker at addr and reads its report, waiting
// up to timeout for a worker that is (re)starting. On error a hop that
// was connected is returned too, for the caller to close.
func (r *Route) dialHop(ctx context.Context, addr string, timeout time.Duration) (*Hop, error) {
	h, err := r.connect(addr)
	if err != nil {
		return nil, err
	}
	if h.Capability, err = h.capability(ctx, timeout); err != nil {
		return h, err
	}
	h.current.Store(newHopState(h.Capability))
	return h, nil
}

// close closes the hop's connection.
func (h *Hop) close() {
	if h.conn != nil {
		h.conn.Close()
	}
}

// check requires validated hops of one model, tiling the layers. Their
// recipes may differ (Mixed).
func (r *Route) check() error {
	if len(r.Hops) == 0 {
		return fmt.Errorf("%w: no hops", ErrRoute)
	}
	first := r.Hops[0].Capability
	next := uint32(0)
	for _, h := range r.Hops {
		c := h.Capability
		switch {
		case !c.Validated:
			return fmt.Errorf("%w: %s is not validated (%s)", ErrRoute, h.Addr, c.Detail)
		case c.Fingerprint.GetModelArtifactDigest() != first.Fingerprint.GetModelArtifactDigest():
			return fmt.Errorf("%w: %s serves another model", ErrRoute, h.Addr)
		case c.ShardRange.GetStartLayer() != next:
			return fmt.Errorf("%w: %s starts at layer %d, the route is at %d", ErrRoute, h.Addr, c.ShardRange.GetStartLayer(), next)
		}
		next = c.ShardRange.GetEndLayer()
	}
	return nil
}

// Health asks every hop for its state: nil when each answers SERVING,
// else an error naming the first hop that does not (or cannot be asked).
func (r *Route) Health(ctx context.Context) error {
	for i, h := range r.current() {
		resp, err := h.client.Health(ctx, &shardv1.HealthRequest{SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1})
		if err != nil {
			return fmt.Errorf("hop %d does not answer Health", i)
		}
		if st := resp.GetState(); st != shardv1.ServingState_SERVING_STATE_SERVING {
			return fmt.Errorf("hop %d is %s", i, strings.TrimPrefix(st.String(), "SERVING_STATE_"))
		}
	}
	return nil
}

// Close closes the connections.
func (r *Route) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range r.pool {
		h.close()
	}
}

// newSessionID returns a random route session id.
func newSessionID() string {
	var b [12]byte
	rand.Read(b[:])
	return "rs-" + hex.EncodeToString(b[:])
}

package route

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/frameout"
	"github.com/meshnet/shardd/stages/reassemble"
	"github.com/meshnet/shardd/stages/receive"
)

// Request is one generation.
type Request struct {
	Prompt    []int32
	MaxTokens int
	Sampling  Sampling
	// Stop ends the generation after a token for which it returns true
	// (an end-of-generation token); nil never stops early.
	Stop func(tok int32) bool
	// Logits, when set, sees each position's logits before the token is
	// sampled from them (n counts tokens from 0). The slice is valid only
	// during the call.
	Logits func(n int, logits []float32)
}

// HopStats is what one hop cost during a generation.
type HopStats struct {
	Addr  string
	Calls int
	// Wall is the time from sending a unit of work to its result (the
	// output chunk, or the Ack or status when there is none), seen by the
	// head; Exec is the execution time the worker reported in the Ack.
	Wall, Exec time.Duration
	// Output is the dtype of the hidden states the hop returned (a hop
	// before the last), e.g. DTYPE_BFLOAT16: where the route rounds.
	Output shardv1.DType
	// OutBytes counts the tensor payload bytes the hop returned (as they
	// crossed the wire: compressed where a hop compressed).
	OutBytes int64
}

// Stats describe a finished generation.
type Stats struct {
	SessionID    string
	PromptTokens int
	Tokens       int
	Prefill      time.Duration // until the first token was sampled
	Decode       time.Duration // the rest
	Hops         []HopStats
	Retries      int // steps resent after a transport error
	Recoveries   int // full re-prefills after a CACHE_MISS
	// Busy counts the tries a full worker refused (RESOURCE_EXHAUSTED,
	// retryable) and the head retried after BusyWait in all.
	Busy           int
	BusyWait       time.Duration
	DuplicateAcks  int
	RefusedDetails []string
	// Vocab is the width of the logits the last hop returned (0 when it
	// returned only compact output).
	Vocab int
	// Compact is the K of the compact output the last hop was asked for
	// (Options.CompactLogits; 0: whole rows, also where the last hop does
	// not advertise it).
	Compact int
	// Failovers describe each hop replaced during the generation, "hop
	// I: OLD -> NEW" (failover.go).
	Failovers []string
	// RecipeChanges describe each hop that came back with another runtime
	// recipe during the generation (a worker restarted with another build
	// on its address), the session rebuilt on it: "ADDR: key: old | new"
	// for each recipe line that differs. With Options.ReplayRecovery such
	// a change ends the generation with ErrRecipeChanged instead.
	RecipeChanges []string
}

type gen struct {
	r *Route
	// hops are the generation's workers: the route's when it started,
	// with the ones it failed over replaced.
	hops    []*Hop
	ctx     context.Context
	id      string
	epoch   uint64
	step    uint64
	streams []*hopStream
	stats   Stats
	framer  *frameout.Framer
	recv    *receive.Pipeline
	logits  []float32
	chunk   int
	// Compact output (Options.CompactLogits): topK is the K asked for
	// (0: whole rows), sent to the last hop as topKTensor beside its input
	// beside its input (request); topIDs and topVals hold the last row's
	// answer.
	topK       int
	topKTensor *shardv1.NamedTensor
	// lenTensor tells every hop, with the prefill chunk at position 0, how
	// long the session will grow (prompt + MaxTokens): workers reserve the
	// KV for it at admission (session_tokens).
	lenTensor *shardv1.NamedTensor
	topIDs    []int32
	topVals   []float32
	// promptLen: the prompt's tokens, which a replayed recovery prefills
	// before it feeds the rest one decode step each.
	promptLen int
	// hist are the units of work since the last prefill from position 0,
	// each with the input every hop was sent (copies), for a replacement
	// hop to replay (failoverHop); histBytes counts their payloads, and
	// noHist says they outgrew maxHistoryBytes and were dropped.
	hist      []*unit
	histBytes int
	noHist    bool
	// mu is held by whichever of a pipelined prefill's stages runs the
	// generation's code; piped says one runs (pipeline.go).
	mu    sync.Mutex
	piped bool
}

// Generate runs one generation, calling emit with each token as it is
// sampled. It returns when MaxTokens were produced, Stop said so, emit
// failed or ctx ended; the session's state is released on every hop.
func (r *Route) Generate(ctx context.Context, req Request, emit func(tok int32) error) (Stats, error) {
	if len(req.Prompt) == 0 {
		return Stats{}, errors.New("route: empty prompt")
	}
	if tp := r.opts.TracerProvider; tp != nil {
		var span trace.Span
		ctx, span = tp.Tracer("github.com/meshnet/shardd/route").Start(ctx, "shardd.generate",
			trace.WithAttributes(attribute.Int("shardd.prompt_tokens", len(req.Prompt)), attribute.Int("shardd.max_tokens", req.MaxTokens)))
		defer span.End()
	}
	g := &gen{r: r, hops: slices.Clone(r.current()), ctx: ctx, id: newSessionID(), epoch: 1, framer: frameout.New(bufpool.Default),
		recv: receive.New(receive.Config{Budget: reassemble.Budget{MaxTensorBytes: 256 << 20}, Checksum: checksum.Policy{Require: true}}, bufpool.Default)}
	defer g.framer.Close()
	defer g.recv.Close()
	g.stats.SessionID, g.stats.PromptTokens = g.id, len(req.Prompt)
	trace.SpanFromContext(ctx).SetAttributes(attribute.String("shardd.route_session", g.id))
	for _, h := range g.hops {
		g.stats.Hops = append(g.stats.Hops, HopStats{Addr: h.Addr})
	}
	g.streams = make([]*hopStream, len(g.hops))
	defer g.close()
	if err := g.openAll(); err != nil && !errors.Is(err, errCacheMiss) {
		return g.stats, err
	}
	g.chunk = g.chunkSize()
	if r.opts.CompactLogits && req.Logits == nil && g.hops[len(g.hops)-1].Features().Has(feature.LogitsTopK) {
		g.askCompact(req.Sampling.Compact())
	}
	g.lenTensor = g.scalar(tensorname.SessionTokens, min(len(req.Prompt)+max(req.MaxTokens, 1), 1<<30))

	start := time.Now()
	g.promptLen = len(req.Prompt)
	fed := append([]int32(nil), req.Prompt...)
	logits, err := g.rebuild(fed, 0)
	if err != nil {
		return g.stats, err
	}
	sm := newSampler(req.Sampling)
	for n := 0; n < req.MaxTokens; n++ {
		if req.Logits != nil {
			req.Logits(n, logits)
		}
		tok := g.pick(sm, logits)
		if n == 0 {
			g.stats.Prefill = time.Since(start)
			start = time.Now()
		}
		g.stats.Tokens++
		if err := emit(tok); err != nil {
			return g.stats, err
		}
		if (req.Stop != nil && req.Stop(tok)) || n == req.MaxTokens-1 {
			break
		}
		fed = append(fed, tok)
		logits, err = g.decode(len(fed)-1, tok)
		if errors.Is(err, errCacheMiss) {
			logits, err = g.rebuild(fed, 1)
		}
		if err != nil {
			return g.stats, err
		}
	}
	g.stats.Decode = time.Since(start)
	g.settle()
	return g.stats, nil
}

// askCompact makes every unit of work ask the last hop for its best k
// logits per row (k = 0: whole rows).
func (g *gen) askCompact(k int) {
	if k <= 0 {
		return
	}
	g.topK, g.stats.Compact = k, k
	g.topKTensor = g.scalar(tensorname.LogitsTopK, k)
}

// scalar frames a tensor that holds one INT32.
func (g *gen) scalar(name string, v int) *shardv1.NamedTensor {
	nt := &shardv1.NamedTensor{}
	g.framer.Frame(nt, name, []int64{1}, shardv1.DType_DTYPE_INT32, binary.LittleEndian.AppendUint32(nil, uint32(v)), frameout.Options{})
	return nt
}

// pick samples the next token from the last step's output: its whole
// logits row, or the compact output. A compact output with fewer than K
// entries is the whole row (the worker holds K to its vocabulary), and
// decodeTop has made it one: the sampler then treats it as it treats any
// whole row.
func (g *gen) pick(sm *sampler, logits []float32) int32 {
	if g.topK > 0 && len(g.topIDs) == g.topK {
		return sm.nextTop(g.topIDs, g.topVals)
	}
	return sm.next(logits)
}

// chunkSize is the prefill chunk the hops all accept.
func (g *gen) chunkSize() int {
	n := 128
	if g.r.opts.PrefillChunk > 0 {
		n = g.r.opts.PrefillChunk
	} else if g.rowsKnown() {
		n = 512
		for i, s := range g.streams[1:] {
			row := g.streams[i].hop.rowBytes.Load()
			if m := int(s.limits.GetMaxChunkBytes()) * 7 / 8; m > 0 {
				n = min(n, max(m/int(row), 1)) // 1/8 left for the envelope
			}
		}
	}
	for _, s := range g.streams {
		if m := int(s.limits.GetMaxPrefillChunkTokens()); m > 0 && m < n {
			n = m
		}
	}
	return n
}

// rowsKnown reports whether every hop but the last has returned hidden
// states, so their row sizes are known.
func (g *gen) rowsKnown() bool {
	for _, s := range g.streams[:len(g.streams)-1] {
		if s.hop.rowBytes.Load() == 0 {
			return false
		}
	}
	return true
}

// prefill feeds tokens from position 0 in chunks and returns the logits of
// the last position: through the hops as a pipeline (prefillPiped) where
// there are several chunks and hops, else one chunk through every hop
// after another.
func (g *gen) prefill(tokens []int32) ([]float32, error) {
	size := g.chunk
	if k := g.pipeChunks(); k > 1 {
		size = min(size, max((len(tokens)+k-1)/k, 1))
	}
	count := (len(tokens) + size - 1) / size
	units := make([]*unit, count)
	for c := range units {
		lo, hi := c*size, min(len(tokens), (c+1)*size)
		info := &shardv1.ChunkInfo{ChunkIndex: uint32(c), ChunkCount: uint32(count), FinalChunk: c == count-1}
		units[c] = g.newUnit(lo, tokens[lo:hi], shardv1.CacheMode_CACHE_MODE_PREFILL, info)
	}
	if count > 1 && g.pipeChunks() > 0 {
		out, err := g.prefillPiped(units)
		if err != nil {
			return nil, err
		}
		return g.outputLogits(out)
	}
	var logits []float32
	for _, u := range units {
		var err error
		if logits, err = g.runUnit(u); err != nil {
			return nil, err
		}
	}
	return logits, nil
}

// pipeChunks is the fewest chunks a prompt is cut into
// (Options.PipelineChunks): 0 where the chunks go through the hops one
// after another (one hop, or pipelining off).
func (g *gen) pipeChunks() int {
	k := g.r.opts.PipelineChunks
	switch {
	case len(g.streams) < 2 || k < 0:
		return 0
	case k == 0:
		return 1
	}
	return k
}

// decode feeds one token at pos through the DecodeStep fast path.
func (g *gen) decode(pos int, tok int32) ([]float32, error) {
	return g.run(pos, []int32{tok}, shardv1.CacheMode_CACHE_MODE_DECODE, nil)
}

// run sends one unit of work through every hop and returns the logits.
func (g *gen) run(first int, ids []int32, mode shardv1.CacheMode, info *shardv1.ChunkInfo) ([]float32, error) {
	return g.runUnit(g.newUnit(first, ids, mode, info))
}

// runUnit sends unit u through every hop and returns the logits.
func (g *gen) runUnit(u *unit) ([]float32, error) {
	if u.first == 0 && u.mode == shardv1.CacheMode_CACHE_MODE_PREFILL {
		g.forget() // a prefill from position 0: history starts again
	}
	var tensors []*shardv1.NamedTensor
	for i := range g.streams {
		out, err := g.send(i, u)
		if err == nil {
			err = g.took(i, u, out)
		}
		if err != nil {
			return nil, err
		}
		if i < len(g.streams)-1 {
			u.in[i+1] = out[0]
		}
		tensors = out
	}
	g.remember(u)
	return g.outputLogits(tensors)
}

// newUnit frames a unit of work of token ids from position first as the
// first hop's input, under the generation's next step.
func (g *gen) newUnit(first int, ids []int32, mode shardv1.CacheMode, info *shardv1.ChunkInfo) *unit {
	g.step++
	body := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		body = binary.LittleEndian.AppendUint32(body, uint32(id))
	}
	tensor := &shardv1.NamedTensor{}
	g.framer.Frame(tensor, tensorname.InputIDs, []int64{int64(len(ids))}, shardv1.DType_DTYPE_INT32, body, frameout.Options{})
	u := &unit{step: g.step, workID: fmt.Sprintf("%s/%d", g.id, g.step), first: first, n: len(ids), mode: mode, info: info,
		in: make([]*shardv1.NamedTensor, len(g.streams))}
	u.in[0] = tensor
	return u
}

// took checks hop i's output for unit u and counts it in the statistics.
func (g *gen) took(i int, u *unit, out []*shardv1.NamedTensor) error {
	if err := g.checkOutput(i, out, u.n); err != nil {
		return err
	}
	for _, t := range out {
		for _, f := range t.Fragments {
			g.stats.Hops[i].OutBytes += int64(len(f.Payload))
		}
	}
	if i < len(g.streams)-1 {
		g.stats.Hops[i].Output = out[0].GetDtype()
	}
	return nil
}

// outputLogits decodes the last hop's output: the logits of the last row.
func (g *gen) outputLogits(tensors []*shardv1.NamedTensor) ([]float32, error) {
	if g.topK > 0 {
		if err := g.decodeTop(tensors); err != nil {
			return nil, err
		}
		return g.logits, nil // the whole row, when the compact output was one
	}
	return g.decodeLogits(tensors[0])
}

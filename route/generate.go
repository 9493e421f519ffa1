package route

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/internal/recipe"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/internal/tracectx"
	"github.com/meshnet/shardd/internal/wireerr"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/decode"
	"github.com/meshnet/shardd/stages/dtype"
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

// hopStream is one generation's Session stream to one hop.
type hopStream struct {
	hop *Hop
	// opened is the hop's report the stream was opened with: its
	// fingerprint and range go in every envelope; epoch is the route
	// epoch it was opened at (a hop failed over alone moves to a newer
	// one than the others').
	opened *shardv1.CapabilityReport
	epoch  uint64
	stream grpc.BidiStreamingClient[shardv1.SessionRequest, shardv1.SessionResponse]
	cancel context.CancelFunc
	limits *shardv1.FlowControl
	// held are the responses of the last exchange: the chunk, Ack or status
	// it returned alias their receive buffers until the next exchange on
	// this stream releases them (a last hop's logits, 4 x vocab bytes per
	// step, are read where gRPC received them). free keeps released ones.
	held, free []*decode.Response
	// ackDue is the step whose output arrived and whose Ack has not been
	// read yet (0: none). The head goes on with the output at once and
	// reads the Ack at the next exchange on this stream: a worker sends a
	// step's Ack after its output, and behind a large output (a last hop's
	// logits) the Ack waits until the transport has written the output.
	ackDue uint64
	// lazyAck: the granted window allows a second un-acked step, so Acks
	// may be read late.
	lazyAck bool
	// hidden is the width of the hidden states this hop returned first (0:
	// none yet); a later output of another width is refused.
	hidden int64
	// watchdog cancels the stream when an exchange (or the drain at the
	// end) outlasts its bound: a hop whose connection wedges without
	// closing fails the step, which is then resent on a fresh stream,
	// instead of holding the generation forever. Armed per exchange.
	watchdog *time.Timer
	// last is the latest step whose output arrived, for Options.Observe:
	// its wall time waits here for its Ack's execution time.
	last struct {
		step   uint64
		decode bool
		wall   time.Duration
	}
}

// recycle releases the last exchange's responses.
func (s *hopStream) recycle() {
	for i, r := range s.held {
		r.Release()
		s.free = append(s.free, r)
		s.held[i] = nil
	}
	s.held = s.held[:0]
}

// response returns an empty Response to receive into.
func (s *hopStream) response() *decode.Response {
	if n := len(s.free); n > 0 {
		r := s.free[n-1]
		s.free = s.free[:n-1]
		return r
	}
	return new(decode.Response)
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

// recipeChanged reads hop i's capability again after it refused the
// fingerprint the head had for it. A worker of another model or range is
// no hop of this route (ErrRoute); one of another recipe is declared:
// with ReplayRecovery, whose promise is bitwise continuation, the
// generation ends (ErrRecipeChanged); otherwise it goes on, the change in
// Stats.RecipeChanges, and the session is rebuilt there (the new worker
// holds none of it: its next step is a CACHE_MISS).
func (g *gen) recipeChanged(i int) error {
	h := g.hops[i]
	old := h.Current()
	c, err := h.capability(g.ctx, g.r.opts.StepTimeout)
	if err != nil {
		return err
	}
	switch {
	case c.GetFingerprint().GetModelArtifactDigest() != old.GetFingerprint().GetModelArtifactDigest() ||
		c.GetShardRange().GetStartLayer() != old.GetShardRange().GetStartLayer() ||
		c.GetShardRange().GetEndLayer() != old.GetShardRange().GetEndLayer():
		return fmt.Errorf("%w: %s now serves another model or layer range", ErrRoute, h.Addr)
	case !c.GetValidated():
		return fmt.Errorf("%w: %s is not validated (%s)", ErrRoute, h.Addr, c.GetDetail())
	}
	h.current.Store(newHopState(c))
	if c.GetFingerprint().GetRuntimeRecipeDigest() == old.GetFingerprint().GetRuntimeRecipeDigest() {
		return nil
	}
	return g.declareRecipe(h, old)
}

// declareRecipe records that hop h now runs another recipe than old
// says, or, with ReplayRecovery, whose promise is bitwise continuation,
// ends the generation with ErrRecipeChanged.
func (g *gen) declareRecipe(h *Hop, old *shardv1.CapabilityReport) error {
	change := h.Addr + ": " + strings.Join(recipe.Diff(old.GetBackend(), h.Recipe()), "; ")
	if g.r.opts.ReplayRecovery {
		return fmt.Errorf("%w: %s", ErrRecipeChanged, change)
	}
	g.stats.RecipeChanges = append(g.stats.RecipeChanges, change)
	return nil
}

// open (re)opens hop i's stream.
func (g *gen) open(i int) error { return g.openStream(i, false) }

// openStream opens hop i's stream; reread: the hop's report was just read
// again after a fingerprint refusal, which is not done twice in a row.
func (g *gen) openStream(i int, reread bool) error {
	if old := g.streams[i]; old != nil {
		old.watchdog.Stop()
		old.cancel()
	}
	h := g.hops[i]
	ctx, cancel := context.WithCancel(g.ctx)
	if tp := g.r.opts.TracerProvider; tp != nil {
		var span trace.Span
		ctx, span = tp.Tracer("github.com/meshnet/shardd/route").Start(ctx, "shardd.hop",
			trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attribute.String("shardd.hop", h.Addr)))
		ctx = tracectx.Inject(ctx)
		cancelCtx := cancel
		cancel = func() { cancelCtx(); span.End() }
	}
	wait := g.r.opts.StepTimeout
	if g.r.canFailover() {
		// A worker that does not open a session within seconds is not
		// waited for when another can take its place.
		wait = min(wait, 5*time.Second)
	}
	openCtx, openCancel := context.WithTimeout(ctx, wait)
	defer openCancel()
	stop := context.AfterFunc(openCtx, func() {
		if openCtx.Err() == context.DeadlineExceeded {
			cancel()
		}
	})
	defer stop()
	unreachable := func() bool { return g.ctx.Err() == nil && openCtx.Err() == context.DeadlineExceeded }
	stream, err := h.client.Session(ctx)
	if err != nil {
		cancel()
		if unreachable() {
			return fmt.Errorf("%w: %s did not open a session within %v", ErrUnreachable, h.Addr, wait)
		}
		return fmt.Errorf("route: %s: %w", h.Addr, err)
	}
	// A stream reopened after a transport error stays at its epoch (the
	// step it resends carries it); a new or failed-over one takes the
	// generation's.
	opened, epoch := h.Current(), g.epoch
	if old := g.streams[i]; old != nil {
		epoch = old.epoch
	}
	err = stream.Send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Open{Open: &shardv1.SessionOpen{
		SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, RouteSessionId: g.id, RouteEpoch: epoch,
		Fingerprint: opened.GetFingerprint(), ShardRange: opened.GetShardRange(),
	}}})
	var resp *shardv1.SessionResponse
	if err == nil {
		resp, err = stream.Recv()
	}
	if err != nil {
		cancel()
		if unreachable() {
			return fmt.Errorf("%w: %s did not open a session within %v", ErrUnreachable, h.Addr, wait)
		}
		return fmt.Errorf("route: %s: open: %w", h.Addr, err)
	}
	a := resp.GetAccepted()
	if a == nil {
		cancel()
		e := resp.GetStatus().GetError()
		if e.GetCode() == shardv1.ErrorCode_ERROR_CODE_FINGERPRINT_MISMATCH && !reread {
			// The worker on this address is not the one dialled: read its
			// report again, and go on with it if it serves the same shard.
			if err := g.recipeChanged(i); err != nil {
				return err
			}
			return g.openStream(i, true)
		}
		return &RefusedError{Addr: h.Addr, Code: e.GetCode(), Detail: "session refused: " + e.GetDetail(), Retryable: e.GetRetryable()}
	}
	fc := a.FlowControl
	g.streams[i] = &hopStream{hop: h, opened: opened, epoch: epoch, stream: stream, cancel: cancel, limits: fc,
		lazyAck: fc.GetCreditsGranted() >= 2 && fc.GetMaxInflightChunks() >= 2, watchdog: time.AfterFunc(time.Hour, cancel)}
	g.streams[i].watchdog.Stop()
	return nil
}

// closeWait bounds how long the end of a generation waits for a hop's
// stream to finish after the release.
const closeWait = 2 * time.Second

// close releases the session on every hop and ends the streams.
func (g *gen) close() {
	for _, s := range g.streams {
		if s == nil {
			continue
		}
		s.stream.Send(&shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Release{Release: &shardv1.ReleaseSignal{
			RouteSessionId: g.id, RouteEpoch: s.epoch}}})
		s.stream.CloseSend()
		s.watchdog.Reset(min(g.r.opts.StepTimeout, closeWait))
		for {
			if _, err := s.stream.Recv(); err != nil {
				break
			}
		}
		s.watchdog.Stop()
		s.cancel()
		s.recycle()
	}
	if g.ctx.Err() != nil {
		// The streams were cut: cancel and release out of band, on fresh calls.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		for _, h := range g.hops {
			h.client.Cancel(ctx, &shardv1.CancelRequest{SchemaVersion: 1, RouteSessionId: g.id, RouteEpoch: g.epoch})
			h.client.Release(ctx, &shardv1.ReleaseRequest{SchemaVersion: 1, RouteSessionId: g.id, RouteEpoch: g.epoch})
		}
	}
}

// rebuild prefills tokens after `misses` cache misses of this step
// (0 for the prompt's first prefill), starting again from position 0 when
// a hop declares the session's state gone part way, until maxRebuilds
// re-prefills in a row have been lost.
func (g *gen) rebuild(tokens []int32, misses int) ([]float32, error) {
	for ; ; misses++ {
		if misses > 0 {
			if misses > maxRebuilds {
				return nil, fmt.Errorf("%w: %d re-prefills in a row were dropped", ErrStateLost, maxRebuilds)
			}
			g.stats.Recoveries++
		}
		var logits []float32
		var err error
		if misses > 0 && g.r.opts.ReplayRecovery {
			logits, err = g.replay(tokens)
		} else {
			logits, err = g.prefill(tokens)
		}
		if !errors.Is(err, errCacheMiss) {
			return logits, err
		}
	}
}

// replay feeds tokens as they were fed the first time: the prompt in its
// chunks, then one decode step per generated token (Options.ReplayRecovery).
func (g *gen) replay(tokens []int32) ([]float32, error) {
	logits, err := g.prefill(tokens[:g.promptLen])
	for pos := g.promptLen; err == nil && pos < len(tokens); pos++ {
		logits, err = g.decode(pos, tokens[pos])
	}
	return logits, err
}

// prefill feeds tokens from position 0 in chunks and returns the logits of
// the last position.
func (g *gen) prefill(tokens []int32) ([]float32, error) {
	count := (len(tokens) + g.chunk - 1) / g.chunk
	var logits []float32
	for c := range count {
		lo, hi := c*g.chunk, min(len(tokens), (c+1)*g.chunk)
		info := &shardv1.ChunkInfo{ChunkIndex: uint32(c), ChunkCount: uint32(count), FinalChunk: c == count-1}
		var err error
		if logits, err = g.run(lo, tokens[lo:hi], shardv1.CacheMode_CACHE_MODE_PREFILL, info); err != nil {
			return nil, err
		}
	}
	return logits, nil
}

// decode feeds one token at pos through the DecodeStep fast path.
func (g *gen) decode(pos int, tok int32) ([]float32, error) {
	return g.run(pos, []int32{tok}, shardv1.CacheMode_CACHE_MODE_DECODE, nil)
}

// run sends one unit of work through every hop and returns the logits.
func (g *gen) run(first int, ids []int32, mode shardv1.CacheMode, info *shardv1.ChunkInfo) ([]float32, error) {
	g.step++
	body := make([]byte, 0, 4*len(ids))
	for _, id := range ids {
		body = binary.LittleEndian.AppendUint32(body, uint32(id))
	}
	tensor := &shardv1.NamedTensor{}
	g.framer.Frame(tensor, tensorname.InputIDs, []int64{int64(len(ids))}, shardv1.DType_DTYPE_INT32, body, frameout.Options{})
	u := &unit{step: g.step, workID: fmt.Sprintf("%s/%d", g.id, g.step), first: first, n: len(ids), mode: mode, info: info,
		in: make([]*shardv1.NamedTensor, len(g.streams))}
	if first == 0 && mode == shardv1.CacheMode_CACHE_MODE_PREFILL {
		g.forget() // a prefill from position 0: history starts again
	}
	input := tensor
	var tensors []*shardv1.NamedTensor
	for i := range g.streams {
		u.in[i] = input
		out, err := g.send(i, u)
		if err != nil {
			return nil, err
		}
		if err := g.checkOutput(i, out, len(ids)); err != nil {
			return nil, err
		}
		for _, t := range out {
			for _, f := range t.Fragments {
				g.stats.Hops[i].OutBytes += int64(len(f.Payload))
			}
		}
		if i < len(g.streams)-1 {
			g.stats.Hops[i].Output = out[0].GetDtype()
			input = out[0]
		}
		tensors = out
	}
	g.remember(u)
	if g.topK > 0 {
		if err := g.decodeTop(tensors); err != nil {
			return nil, err
		}
		return g.logits, nil // the whole row, when the compact output was one
	}
	return g.decodeLogits(tensors[0])
}

// send sends unit u to hop i (its input u.in[i]) and returns the output,
// failing the hop over when its worker is gone: the replacement replays
// the session's history (failoverHop) and gets u, or, where that cannot
// be, every hop starts again from position 0 (errCacheMiss).
func (g *gen) send(i int, u *unit) ([]*shardv1.NamedTensor, error) {
	for {
		out, err := g.call(i, g.request(i, u))
		var down *HopDownError
		if !errors.As(err, &down) {
			return out, err
		}
		if err := g.failoverHop(i, err); err != nil {
			return nil, err
		}
	}
}

// request frames unit u for hop i: its input, and beside it the
// session's length on its first prefill chunk and the compact output's K
// to the last hop, each only to a hop that advertises it.
func (g *gen) request(i int, u *unit) *shardv1.SessionRequest {
	deadline := time.Now().Add(g.r.opts.StepTimeout)
	if d, ok := g.ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	hs := g.streams[i]
	if i == len(g.streams)-1 && g.topKTensor != nil && !hs.hop.Features().Has(feature.LogitsTopK) {
		// The last hop came back as a worker without compact output
		// (recipeChanged): whole rows from here on.
		g.topK, g.topKTensor, g.stats.Compact = 0, nil, 0
	}
	tensors := []*shardv1.NamedTensor{u.in[i]}
	opening := u.mode == shardv1.CacheMode_CACHE_MODE_PREFILL && u.first == 0
	if opening && hs.hop.Features().Has(feature.SessionTokens) {
		tensors = append(tensors, g.lenTensor)
	}
	if i == len(g.streams)-1 && g.topKTensor != nil {
		tensors = append(tensors, g.topKTensor)
	}
	if u.mode == shardv1.CacheMode_CACHE_MODE_DECODE && len(tensors) == 1 {
		return &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Decode{Decode: &shardv1.DecodeStep{
			IdempotencyStep: u.step, Position: uint64(u.first), ExpectedPastLen: uint64(u.first),
			Tensor: tensors[0], WorkId: u.workID, DeadlineUnixNanos: deadline.UnixNano(),
		}}}
	}
	phase := shardv1.Phase_PHASE_PREFILL
	expect := &shardv1.CacheExpectation{Mode: u.mode}
	if u.mode == shardv1.CacheMode_CACHE_MODE_DECODE {
		phase, expect.ExpectedPastLen = shardv1.Phase_PHASE_DECODE, uint64(u.first)
	}
	return &shardv1.SessionRequest{Kind: &shardv1.SessionRequest_Chunk{Chunk: &shardv1.ActivationChunk{
		Envelope: &shardv1.Envelope{
			SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1, WorkId: u.workID, RouteSessionId: g.id,
			RouteEpoch: hs.epoch, Fingerprint: hs.opened.GetFingerprint(), ShardRange: hs.opened.GetShardRange(),
			Phase: phase, Position: &shardv1.PositionSpan{FirstPosition: uint64(u.first), TokenCount: uint32(u.n)},
			IdempotencyStep: u.step, CacheExpectation: expect, DeadlineUnixNanos: deadline.UnixNano(), Chunk: u.info,
		},
		Bundle: &shardv1.TensorBundle{BundleVersion: 1, Tensors: tensors},
	}}}
}

// call sends req to hop i and returns the output tensors, riding out a
// full worker (busy refusals) as Options.BusyTimeout says.
func (g *gen) call(i int, req *shardv1.SessionRequest) ([]*shardv1.NamedTensor, error) {
	var since time.Time
	for try := 0; ; try++ {
		out, err := g.callOnce(i, req)
		if err == nil || !busy(err) {
			return out, err
		}
		if g.r.canFailover() && g.draining(i) {
			// A draining worker: its sessions move to a standby rather than
			// wait (serve --drain-handoff refuses their steps).
			return nil, &HopDownError{Hop: i, Addr: g.hops[i].Addr, Cause: fmt.Errorf("draining: %w", err)}
		}
		if err := g.rideOut(&since, try, err); err != nil {
			return nil, err
		}
	}
}

// openBusy opens hop i's stream, riding out a worker with no free session
// slot as call does; a draining worker, which refuses new sessions the same
// way until it exits, is not waited for.
func (g *gen) openBusy(i int) error {
	var since time.Time
	for try := 0; ; try++ {
		err := g.open(i)
		if err == nil || !busy(err) || g.draining(i) {
			return err
		}
		if err := g.rideOut(&since, try, err); err != nil {
			return err
		}
	}
}

// draining asks hop i whether it is draining (Health), within a second.
func (g *gen) draining(i int) bool {
	ctx, cancel := context.WithTimeout(g.ctx, time.Second)
	defer cancel()
	h, err := g.hops[i].client.Health(ctx, &shardv1.HealthRequest{SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1})
	return err == nil && h.GetState() == shardv1.ServingState_SERVING_STATE_DRAINING
}

// rideOut waits before the next try after busy refusal err (the try-th
// in a row, the first at *since): a backoff of 10 ms doubling to 1 s, with
// jitter so that many heads refused together do not return together. It
// returns an error that says so when the generation's deadline (or, with
// none, Options.BusyTimeout after the first refusal) leaves no time.
func (g *gen) rideOut(since *time.Time, try int, err error) error {
	now := time.Now()
	if since.IsZero() {
		*since = now
	}
	limit := since.Add(g.r.opts.BusyTimeout)
	if d, ok := g.ctx.Deadline(); ok {
		limit = d
	}
	wait := min(10*time.Millisecond<<min(try, 7), time.Second)
	wait = wait/2 + time.Duration(rand.Int64N(int64(wait)))
	if now.Add(wait).After(limit) {
		return fmt.Errorf("route: the worker stayed full for %v (%d tries), past the generation's deadline: %w", now.Sub(*since).Round(time.Millisecond), try+1, err)
	}
	g.stats.Busy++
	g.stats.BusyWait += wait
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-g.ctx.Done():
		return g.ctx.Err()
	}
}

// callOnce sends req to hop i and returns the output tensors, resending the
// same step on a fresh stream after a transport error.
func (g *gen) callOnce(i int, req *shardv1.SessionRequest) ([]*shardv1.NamedTensor, error) {
	hs := &g.stats.Hops[i]
	var lastErr error
	for attempt := 0; attempt <= g.r.opts.Retries; attempt++ {
		if attempt > 0 {
			g.stats.Retries++
			if err := g.open(i); err != nil {
				lastErr = err
				if g.ctx.Err() != nil {
					return nil, g.ctx.Err()
				}
				if errors.Is(err, ErrRecipeChanged) || errors.Is(err, ErrRoute) {
					return nil, err // another worker than the route's: no retry mends that
				}
				if errors.Is(err, ErrUnreachable) {
					// Waited for it to come back, in vain.
					return nil, &HopDownError{Hop: i, Addr: g.hops[i].Addr, Cause: err}
				}
				continue
			}
		}
		t0 := time.Now()
		chunk, ack, st, err := g.exchange(i, req)
		if err != nil {
			lastErr = err
			if g.ctx.Err() != nil {
				return nil, g.ctx.Err()
			}
			if g.r.canFailover() {
				if derr := g.down(i, err); derr != nil {
					return nil, derr // gone: another worker takes its place
				}
			}
			continue
		}
		wall := time.Since(t0)
		hs.Calls++
		hs.Wall += wall
		last := &g.streams[i].last
		last.step, last.wall = g.step, wall
		last.decode = req.GetDecode() != nil || req.GetChunk().GetEnvelope().GetPhase() == shardv1.Phase_PHASE_DECODE
		if ack == nil && st == nil {
			// The output came first; its Ack is read at the next exchange.
			return chunk.GetBundle().GetTensors(), nil
		}
		if st != nil {
			if st.GetError().GetCode() == shardv1.ErrorCode_ERROR_CODE_CACHE_MISS {
				return nil, errCacheMiss
			}
			g.stats.RefusedDetails = append(g.stats.RefusedDetails, st.GetError().GetDetail())
			return nil, &RefusedError{Addr: g.streams[i].hop.Addr, Code: st.GetError().GetCode(), Detail: st.GetError().GetDetail(),
				Retryable: st.GetError().GetRetryable()}
		}
		g.countAck(i, ack)
		if chunk == nil {
			// A duplicate whose result the worker no longer holds: the
			// state is right but the output is gone; rebuild it.
			return nil, errCacheMiss
		}
		return chunk.GetBundle().GetTensors(), nil
	}
	return nil, &HopDownError{Hop: i, Addr: g.hops[i].Addr, Cause: fmt.Errorf("step failed after %d attempts: %w", g.r.opts.Retries+1, lastErr)}
}

// countAck adds an Ack's figures to hop i's statistics.
func (g *gen) countAck(i int, ack *shardv1.Ack) {
	g.stats.Hops[i].Exec += time.Duration(ack.ExecutionNanos)
	if ack.Duplicate {
		g.stats.DuplicateAcks++
		return
	}
	if obs := g.r.opts.Observe; obs != nil {
		if last := g.streams[i].last; last.step == ack.IdempotencyStep {
			obs(StepSample{Hop: i, Decode: last.decode, Wall: last.wall, Exec: time.Duration(ack.ExecutionNanos)})
		}
	}
}

// exchange sends one unit of work to hop i and reads until its output
// chunk (when the stream allows the Ack to be read late: then ack and st are
// nil), its Ack or its ShardStatus. An Ack still due from the previous
// exchange is read on the way. What it returns is valid until the next
// exchange on the stream.
func (g *gen) exchange(i int, req *shardv1.SessionRequest) (*shardv1.ActivationChunk, *shardv1.Ack, *shardv1.ShardStatus, error) {
	s := g.streams[i]
	s.recycle()
	s.watchdog.Reset(g.r.opts.StepTimeout)
	defer s.watchdog.Stop()
	if err := s.stream.Send(req); err != nil {
		return nil, nil, nil, err
	}
	var chunk *shardv1.ActivationChunk
	for {
		resp := s.response()
		// Still held on error: RecvMsg may have failed after decoding.
		s.held = append(s.held, resp)
		if err := s.stream.RecvMsg(resp); err != nil {
			if err == io.EOF {
				return nil, nil, nil, io.ErrUnexpectedEOF
			}
			return nil, nil, nil, err
		}
		switch k := resp.Msg.Kind.(type) {
		case *shardv1.SessionResponse_Chunk:
			chunk = k.Chunk
			if s.lazyAck && s.ackDue == 0 {
				s.ackDue = k.Chunk.GetEnvelope().GetIdempotencyStep()
				return chunk, nil, nil, nil
			}
		case *shardv1.SessionResponse_Ack:
			if s.ackDue != 0 && k.Ack.IdempotencyStep == s.ackDue {
				s.ackDue = 0
				g.countAck(i, k.Ack)
				continue
			}
			return chunk, k.Ack, nil, nil
		case *shardv1.SessionResponse_Status:
			return nil, nil, k.Status, nil
		}
	}
}

// settle reads the Acks still due on every stream, so that a finished
// generation's statistics count every step.
func (g *gen) settle() {
	for i, s := range g.streams {
		if s == nil {
			continue
		}
		s.watchdog.Reset(g.r.opts.StepTimeout)
		for s.ackDue != 0 {
			var resp decode.Response
			if err := s.stream.RecvMsg(&resp); err != nil {
				break
			}
			if ack := resp.Msg.GetAck(); ack != nil && ack.IdempotencyStep == s.ackDue {
				s.ackDue = 0
				g.countAck(i, ack)
			}
			resp.Release()
		}
		s.watchdog.Stop()
	}
}

// checkOutput refuses a hop's output the head cannot pass on or use: not
// exactly one tensor, or one of the wrong name, dtype or shape for rows
// input rows. A hidden state's width must stay what the hop first sent.
// (Payload sizes and checksums are checked where the bytes are read: the
// next hop for hidden states, decodeLogits for logits.)
func (g *gen) checkOutput(i int, ts []*shardv1.NamedTensor, rows int) error {
	bad := func(format string, args ...any) error {
		return &ResponseError{Addr: g.streams[i].hop.Addr, Detail: fmt.Sprintf(format, args...)}
	}
	if i == len(g.streams)-1 && g.topK > 0 {
		return g.checkTop(ts, rows, bad)
	}
	if len(ts) != 1 || ts[0] == nil {
		return bad("%d output tensors, want 1", len(ts))
	}
	nt := ts[0]
	if i == len(g.streams)-1 {
		if nt.Name != tensorname.Logits || nt.Dtype != shardv1.DType_DTYPE_FLOAT32 {
			return bad("the last hop returned %.64q as %s, want logits as FLOAT32", nt.Name, nt.Dtype)
		}
		if len(nt.Shape) != 2 || nt.Shape[0] < 1 || nt.Shape[0] > int64(rows) || nt.Shape[1] < 1 || nt.Shape[1] > maxVocab ||
			(g.stats.Vocab != 0 && nt.Shape[1] != int64(g.stats.Vocab)) {
			return bad("logits shape %v for %d input rows (vocabulary %d)", nt.Shape, rows, g.stats.Vocab)
		}
		return nil
	}
	if nt.Name != tensorname.Hidden || (nt.Dtype != shardv1.DType_DTYPE_BFLOAT16 && nt.Dtype != shardv1.DType_DTYPE_FLOAT32) {
		return bad("returned %.64q as %s, want hidden_states as BFLOAT16 or FLOAT32", nt.Name, nt.Dtype)
	}
	width := &g.streams[i].hidden
	if len(nt.Shape) != 2 || nt.Shape[0] != int64(rows) || nt.Shape[1] < 1 || nt.Shape[1] > maxHidden || (*width != 0 && nt.Shape[1] != *width) {
		return bad("hidden_states shape %v for %d input rows", nt.Shape, rows)
	}
	*width = nt.Shape[1]
	g.streams[i].hop.rowBytes.Store(nt.Shape[1] * int64(dtype.Size(nt.Dtype)))
	return nil
}

// checkTop refuses a last hop's compact output of the wrong form: the two
// tensors (values FLOAT32, ids INT32) of one shape [rows' <= rows, K' <=
// the K asked].
func (g *gen) checkTop(ts []*shardv1.NamedTensor, rows int, bad func(string, ...any) error) error {
	if len(ts) != 2 || ts[0] == nil || ts[1] == nil {
		return bad("%d output tensors, want the compact output's 2", len(ts))
	}
	v, id := ts[0], ts[1]
	if v.Name != tensorname.TopValues || v.Dtype != shardv1.DType_DTYPE_FLOAT32 || id.Name != tensorname.TopIDs || id.Dtype != shardv1.DType_DTYPE_INT32 {
		return bad("the last hop returned %.64q as %s and %.64q as %s, want %s as FLOAT32 and %s as INT32",
			v.Name, v.Dtype, id.Name, id.Dtype, tensorname.TopValues, tensorname.TopIDs)
	}
	if len(v.Shape) != 2 || v.Shape[0] < 1 || v.Shape[0] > int64(rows) || v.Shape[1] < 1 || v.Shape[1] > int64(g.topK) ||
		!slices.Equal(v.Shape, id.Shape) {
		return bad("compact output shapes %v and %v for %d input rows and %d asked", v.Shape, id.Shape, rows, g.topK)
	}
	return nil
}

// decodeTop reads the last hop's compact output (already checked by
// checkTop), each tensor tiled and checked by CRC32C, into g.topIDs and
// g.topVals: the last row's best tokens, which must be valid ids in the
// ranking's order (larger logit first, ties to the lower id).
func (g *gen) decodeTop(ts []*shardv1.NamedTensor) error {
	addr := g.streams[len(g.streams)-1].hop.Addr
	g.logits = g.logits[:0]
	var vt, it stages.Tensor
	defer vt.Reset()
	defer it.Reset()
	for _, x := range []struct {
		t  *stages.Tensor
		nt *shardv1.NamedTensor
	}{{&vt, ts[0]}, {&it, ts[1]}} {
		if err := g.recv.Tensor(x.t, x.nt, true); err != nil {
			return &ResponseError{Addr: addr, Detail: x.nt.Name + ": " + wireerr.ToShardError(err).Detail}
		}
	}
	rows, k := int(ts[0].Shape[0]), int(ts[0].Shape[1])
	vb, ib := vt.Contiguous(bufpool.Default), it.Contiguous(bufpool.Default)
	if len(vb) != 4*rows*k || len(ib) != 4*rows*k {
		return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output of shape %v in %d and %d bytes", ts[0].Shape, len(vb), len(ib))}
	}
	g.topVals = dtype.AppendF32FromBytes(g.topVals[:0], vb[len(vb)-4*k:])
	g.topIDs = g.topIDs[:0]
	for j := len(ib) - 4*k; j < len(ib); j += 4 {
		g.topIDs = append(g.topIDs, int32(binary.LittleEndian.Uint32(ib[j:])))
	}
	for j, id := range g.topIDs {
		if id < 0 || id >= maxVocab {
			return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output token id %d", id)}
		}
		if j > 0 {
			a, b := g.topVals[j-1], g.topVals[j]
			if !(a > b || (a == b && g.topIDs[j-1] < id)) {
				return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output out of order at %d", j)}
			}
		}
	}
	if k < g.topK {
		return g.wholeRow(addr)
	}
	return nil
}

// wholeRow rebuilds, from a compact output of fewer than K entries, the
// whole logits row it is: every id of the vocabulary exactly once.
func (g *gen) wholeRow(addr string) error {
	k := len(g.topIDs)
	g.logits = slices.Grow(g.logits[:0], k)[:k]
	seen := make([]bool, k)
	for j, id := range g.topIDs {
		if int(id) >= k || seen[id] {
			return &ResponseError{Addr: addr, Detail: fmt.Sprintf("compact output of %d of %d asked is not a whole vocabulary", k, g.topK)}
		}
		seen[id] = true
		g.logits[id] = g.topVals[j]
	}
	g.stats.Vocab = k
	return nil
}

// Bounds on what a worker may claim: no model the head drives is wider.
const (
	maxVocab  = 1 << 22
	maxHidden = 1 << 17
)

// decodeLogits reads the last hop's logits tensor (already checked by
// checkOutput): its fragments must tile it and pass CRC32C, and its bytes
// must be exactly its shape's. It returns the last row.
func (g *gen) decodeLogits(nt *shardv1.NamedTensor) ([]float32, error) {
	addr := g.streams[len(g.streams)-1].hop.Addr
	var t stages.Tensor
	defer t.Reset()
	if err := g.recv.Tensor(&t, nt, true); err != nil {
		return nil, &ResponseError{Addr: addr, Detail: "logits: " + wireerr.ToShardError(err).Detail}
	}
	body := t.Contiguous(bufpool.Default)
	rows, vocab := int(nt.Shape[0]), int(nt.Shape[1])
	if len(body) != 4*rows*vocab {
		return nil, &ResponseError{Addr: addr, Detail: fmt.Sprintf("logits of shape %v in %d bytes", nt.Shape, len(body))}
	}
	g.stats.Vocab = vocab
	g.logits = dtype.AppendF32FromBytes(g.logits[:0], body[len(body)-4*vocab:])
	return g.logits, nil
}

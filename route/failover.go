package route

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tensorname"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/dtype"
	"github.com/meshnet/shardd/stages/frameout"
)

// Failover: a hop whose worker is gone is replaced, and the generation
// goes on.
//
// A hop counts as failed when a transport error outlives its retries, or
// when, after a transport error, the worker does not answer Health
// within probeTimeout or answers DRAINING, or when it refuses a new
// session while draining. The route then asks for a replacement
// (Options.Replace, or the next of Options.Alternates) and, once one
// serves the same model and layer range, puts it in the hop's place for
// every generation from then on; the failed address is tried again only
// after a health check says SERVING.
//
// Which hops re-prefill. The head keeps, for the session's units of work
// since its last prefill from position 0, the input it sent each hop
// (token ids to the first, the previous hop's hidden states to the
// others; up to maxHistoryBytes a generation). The replacement alone
// moves to epoch + 1 and gets the session by replaying those inputs to
// it; the unit that failed is then sent to it, and the generation goes
// on. The other hops keep their
// sessions: their inputs did not change. Without Options.ReplayRecovery
// the inputs are joined and replayed as prefill chunks (a few forwards);
// with it, unit by unit in their original shapes, and the
// replacement's outputs must equal, bit for bit, what the hop after it
// was sent (a worker of the same recipe in --exact mode computes
// them so), and the tokens after the failover are those of an
// uninterrupted run; where they differ, or the history was dropped, or
// the replay fails, every hop moves to epoch + 1 (a newer epoch makes a
// worker drop the session's old state) and everything fed so far is
// prefilled again from position 0, under the same route session id, as
// after a CACHE_MISS; the workers' prefix caches answer what they hold.
// Without ReplayRecovery the replacement's outputs may differ from the
// failed worker's in their last bits (batching), and the later hops keep
// state computed from the old ones: as close as any batched run.

// ErrHopFailed: a hop's worker is gone (HopDownError).
var ErrHopFailed = errors.New("route: a hop's worker failed")

// HopDownError says which hop failed and why; it matches ErrHopFailed
// and its cause with errors.Is.
type HopDownError struct {
	Hop   int
	Addr  string
	Cause error
}

func (e *HopDownError) Error() string {
	return fmt.Sprintf("%v: hop %d (%s): %v", ErrHopFailed, e.Hop, e.Addr, e.Cause)
}

func (e *HopDownError) Unwrap() []error { return []error{ErrHopFailed, e.Cause} }

// down reports whether hop i, after a transport error, is gone: it does
// not answer Health in time, or is draining. nil: it serves (a hiccup;
// the step is retried).
func (g *gen) down(i int, cause error) error {
	if g.ctx.Err() != nil {
		return nil
	}
	h := g.hops[i]
	if err := h.health(g.ctx); err != nil {
		return &HopDownError{Hop: i, Addr: h.Addr, Cause: fmt.Errorf("%v after %w", err, cause)}
	}
	return nil
}

// failover replaces failed hop i (err a HopDownError) and restarts every
// hop at a new epoch (restartAll): errCacheMiss, on which the caller
// prefills everything fed so far again; or the failure when the hop
// cannot be replaced.
func (g *gen) failover(i int, err error) error {
	if err := g.replaceHop(i, err); err != nil {
		return err
	}
	return g.restartAll()
}

// failoverHop replaces failed hop i (err a HopDownError) and replays the
// session's history to the replacement alone; nil when it holds the
// session as the failed worker did, so the unit in flight can go to it.
// Otherwise it restarts every hop (errCacheMiss), or returns the failure.
func (g *gen) failoverHop(i int, err error) error {
	if g.noHist {
		return g.failover(i, err)
	}
	if err := g.replaceHop(i, err); err != nil {
		return err
	}
	g.epoch++
	g.closeStream(i)
	if err := g.openBusy(i); err != nil {
		if down := g.openFailed(i, err); down != nil && len(g.stats.Failovers) < maxFailovers {
			return g.failoverHop(i, down)
		}
		return err
	}
	g.stats.Recoveries++
	if !g.r.opts.ReplayRecovery {
		// Nothing bitwise to keep: the history in prefill chunks, a few
		// forwards instead of one a unit.
		return g.replayBulk(i)
	}
	for _, u := range g.hist {
		out, err := g.call(i, g.request(i, u))
		if err != nil {
			return g.replayFailed(i, err)
		}
		if i < len(g.streams)-1 && !sameTensor(out, u.in[i+1]) {
			// Not the bits the next hop was sent: bitwise continuation
			// needs every hop rebuilt.
			return g.restartAll()
		}
	}
	return nil
}

// replayFailed handles a replay step's error on hop i: the replacement
// gone too fails over again; anything else restarts every hop.
func (g *gen) replayFailed(i int, err error) error {
	var down *HopDownError
	if errors.As(err, &down) && len(g.stats.Failovers) < maxFailovers {
		return g.failoverHop(i, err)
	}
	return g.restartAll()
}

// replayBulk rebuilds the session on hop i's new stream from its history
// in prefill chunks: the units' inputs to hop i (token ids, or hidden
// states as rows) joined in position order and cut into chunks of at
// most g.chunk rows. A chunk takes the idempotency step of the unit at its
// index, below the unit in flight's. nil when hop i holds the session
// again; otherwise every hop restarts (errCacheMiss), or the failure.
func (g *gen) replayBulk(i int) error {
	if len(g.hist) == 0 {
		return nil
	}
	body, width, dt, err := g.joinInputs(i)
	if err != nil {
		return g.restartAll()
	}
	rows := len(body) / width
	count := (rows + g.chunk - 1) / g.chunk
	if count > len(g.hist) {
		return g.restartAll()
	}
	for c := range count {
		lo, hi := c*g.chunk, min(rows, (c+1)*g.chunk)
		nt := &shardv1.NamedTensor{}
		name, shape := tensorname.Hidden, []int64{int64(hi - lo), int64(width / dtype.Size(dt))}
		if i == 0 {
			name, shape = tensorname.InputIDs, []int64{int64(hi - lo)}
		}
		g.framer.Frame(nt, name, shape, dt, body[lo*width:hi*width], frameout.Options{})
		u := &unit{step: g.hist[c].step, workID: g.hist[c].workID, first: lo, n: hi - lo, mode: shardv1.CacheMode_CACHE_MODE_PREFILL,
			info: &shardv1.ChunkInfo{ChunkIndex: uint32(c), ChunkCount: uint32(count), FinalChunk: c == count-1},
			in:   make([]*shardv1.NamedTensor, len(g.streams))}
		u.in[i] = nt
		if _, err := g.call(i, g.request(i, u)); err != nil {
			return g.replayFailed(i, err)
		}
	}
	return nil
}

// joinInputs returns hop i's inputs over the history as one body of rows
// (width bytes each, of dtype dt), in position order.
func (g *gen) joinInputs(i int) (body []byte, width int, dt shardv1.DType, err error) {
	var t stages.Tensor
	defer t.Reset()
	pos := 0
	for _, u := range g.hist {
		nt := u.in[i]
		if u.first != pos || len(nt.GetShape()) == 0 || nt.GetShape()[0] != int64(u.n) {
			return nil, 0, 0, fmt.Errorf("route: history out of order at position %d", u.first)
		}
		t.Reset()
		if err := g.recv.Tensor(&t, nt, true); err != nil {
			return nil, 0, 0, err
		}
		b := t.Contiguous(bufpool.Default)
		if dt = nt.GetDtype(); width == 0 {
			width = len(b) / u.n
		}
		if width == 0 || len(b) != width*u.n {
			return nil, 0, 0, fmt.Errorf("route: history rows of %d bytes, %d rows", len(b), u.n)
		}
		body = append(body, b...)
		pos += u.n
	}
	return body, width, dt, nil
}

// replaceHop puts a replacement in failed hop i's place for this
// generation (and the route), counting it in Stats.Failovers and
// declaring a recipe change; err is the failure, returned when the hop
// cannot be replaced.
func (g *gen) replaceHop(i int, err error) error {
	if !g.r.canFailover() || g.ctx.Err() != nil || len(g.stats.Failovers) >= maxFailovers {
		return err
	}
	old := g.hops[i]
	h, rerr := g.r.replace(g.ctx, i, old, err)
	if rerr != nil {
		return fmt.Errorf("%w; %w", err, rerr)
	}
	g.hops[i] = h
	g.stats.Failovers = append(g.stats.Failovers, fmt.Sprintf("hop %d: %s -> %s", i, old.Addr, h.Addr))
	if h.Recipe() != old.Recipe() {
		return g.declareRecipe(h, old.Current())
	}
	return nil
}

// restartAll moves the generation to a new epoch on every hop, its
// streams reopened, and returns errCacheMiss: the caller prefills
// everything fed so far again.
func (g *gen) restartAll() error {
	g.epoch++
	for j := range g.streams {
		g.closeStream(j)
	}
	if err := g.openAll(); err != nil {
		return err
	}
	g.chunk = g.chunkSize()
	return errCacheMiss
}

// closeStream ends hop i's stream (the worker's session state, if it
// lives, is superseded by the next epoch or expires).
func (g *gen) closeStream(i int) {
	if s := g.streams[i]; s != nil {
		s.watchdog.Stop()
		s.cancel()
		s.recycle()
		g.streams[i] = nil
	}
}

// unit is one unit of work as the hops were sent it: a prefill chunk or
// a decode step, and each hop's input.
type unit struct {
	step     uint64
	workID   string
	first, n int
	mode     shardv1.CacheMode
	info     *shardv1.ChunkInfo
	in       []*shardv1.NamedTensor
}

// maxHistoryBytes bounds the inputs a generation keeps for failovers;
// past it, a failover restarts every hop.
const maxHistoryBytes = 64 << 20

// remember keeps unit u, run through every hop, in the history: its
// inputs are copied, for the hidden states alias receive buffers that the
// next exchange reuses.
func (g *gen) remember(u *unit) {
	if g.noHist || !g.r.canFailover() {
		return
	}
	for i, t := range u.in {
		c := cloneTensor(t)
		for _, f := range c.Fragments {
			g.histBytes += len(f.Payload)
		}
		u.in[i] = c
	}
	if g.histBytes > maxHistoryBytes {
		g.noHist, g.hist = true, nil
		return
	}
	g.hist = append(g.hist, u)
}

// cloneTensor copies t out of the receive buffer it may alias: CloneVT
// copies the payloads, but a string it shares, and the unsafe unmarshal
// made the name a view of the buffer, which the stream's next exchange
// reuses.
func cloneTensor(t *shardv1.NamedTensor) *shardv1.NamedTensor {
	c := t.CloneVT()
	c.Name = strings.Clone(c.Name)
	return c
}

// forget drops the history: the session is prefilled from position 0.
func (g *gen) forget() {
	g.hist, g.histBytes = g.hist[:0], 0
}

// sameTensor reports whether a hop's output is bit for bit the tensor
// the next hop was sent (dtype, shape, and every fragment's bytes).
func sameTensor(out []*shardv1.NamedTensor, want *shardv1.NamedTensor) bool {
	if len(out) != 1 || out[0].GetDtype() != want.GetDtype() || !slices.Equal(out[0].GetShape(), want.GetShape()) ||
		len(out[0].GetFragments()) != len(want.GetFragments()) {
		return false
	}
	for j, f := range out[0].GetFragments() {
		w := want.GetFragments()[j]
		if f.GetByteOffset() != w.GetByteOffset() || !bytes.Equal(f.GetPayload(), w.GetPayload()) {
			return false
		}
	}
	return true
}

// maxFailovers bounds the failovers of one generation.
const maxFailovers = 8

// openAll opens every hop's stream not open yet, failing over a hop whose
// worker is gone (openFailed). It returns errCacheMiss when it failed
// over: the state of anything fed before is gone.
func (g *gen) openAll() error {
	for i := range g.streams {
		if g.streams[i] != nil {
			continue
		}
		err := g.openBusy(i)
		if err == nil {
			continue
		}
		down := g.openFailed(i, err)
		if down == nil || len(g.stats.Failovers) >= maxFailovers {
			return err
		}
		return g.failover(i, down) // reopens every stream
	}
	return nil
}

// openFailed reports, for hop i whose stream did not open (err), whether
// its worker is gone: unreachable, draining, or not answering Health
// after a transport error. nil: the error is the generation's.
func (g *gen) openFailed(i int, err error) *HopDownError {
	var re *RefusedError
	switch {
	case g.ctx.Err() != nil || errors.Is(err, ErrRoute) || errors.Is(err, ErrRecipeChanged):
		return nil
	case errors.Is(err, ErrUnreachable):
	case errors.As(err, &re):
		if !busy(err) || !g.draining(i) {
			return nil
		}
		err = fmt.Errorf("draining: %w", err)
	default:
		var down *HopDownError
		if d := g.down(i, err); d == nil || !errors.As(d, &down) {
			return nil
		}
	}
	return &HopDownError{Hop: i, Addr: g.hops[i].Addr, Cause: err}
}

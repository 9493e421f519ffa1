// Riding out what a hop refuses without failing the generation: a full
// worker (busy refusals, retried within Options.BusyTimeout), a changed
// recipe, and a CACHE_MISS (the session rebuilt by re-prefilling what was
// fed). A gone worker is failover.go's.

package route

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/recipe"
)

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
	g.yield()
	defer g.resume()
	select {
	case <-t.C:
		return nil
	case <-g.ctx.Done():
		return g.ctx.Err()
	}
}

// RefusedError is a worker's structured refusal of a unit of work (its
// ShardStatus error). It matches ErrRefused with errors.Is.
type RefusedError struct {
	Addr   string
	Code   shardv1.ErrorCode
	Detail string
	// Retryable: the worker said the same work may be retried unchanged.
	Retryable bool
}

// busy reports whether err is a full worker's retryable refusal, which
// the head rides out (Options.BusyTimeout).
func busy(err error) bool {
	var re *RefusedError
	return errors.As(err, &re) && re.Retryable && re.Code == shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%v: %s: %s: %s", ErrRefused, e.Addr, e.Code, e.Detail)
}

func (e *RefusedError) Unwrap() error { return ErrRefused }

// Standbys: where a failed hop's replacement comes from (Options.Replace,
// Options.Alternates and their pooled connections), how it is checked to
// serve the same model and layer range, and the route syntax that names
// alternates (ParseRoute). failover.go moves a generation onto it.

package route

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// Replacer returns the address of a worker to take failed hop's place
// (the control plane's part of failover): it is called with the failed
// worker's address and why it failed, and is called again, with the
// address it gave, when that one does not serve the hop either.
type Replacer func(ctx context.Context, hop int, failed string, cause error) (string, error)

// ErrNoReplacement: no worker is left to take a failed hop's place.
var ErrNoReplacement = errors.New("route: no replacement for the failed hop")

// probeTimeout bounds the health check that confirms a hop is down.
const probeTimeout = time.Second

// maxReplaceTries bounds the replacements tried for one failure.
const maxReplaceTries = 8

// canFailover reports whether a failed hop can be replaced.
func (r *Route) canFailover() bool { return r.opts.Replace != nil || len(r.opts.Alternates) > 0 }

// current is the route's hops now (copy on write: a failover swaps in a
// new slice).
func (r *Route) current() []*Hop {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// replace puts a worker in failed hop i's place and returns it; when
// another generation has already replaced failed, its replacement.
func (r *Route) replace(ctx context.Context, i int, failed *Hop, cause error) (*Hop, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.cur[i]; cur != failed {
		return cur, nil
	}
	r.failed[failed.Addr] = time.Now()
	last := failed.Addr
	for range maxReplaceTries {
		addr, err := r.pick(ctx, i, last, cause)
		if err != nil {
			return nil, err
		}
		h, err := r.pooled(ctx, addr)
		if err == nil {
			err = r.fits(i, h)
		}
		if err != nil {
			r.failed[addr], last, cause = time.Now(), addr, err
			continue
		}
		cur := slices.Clone(r.cur)
		cur[i] = h
		r.cur = cur
		return h, nil
	}
	return nil, fmt.Errorf("%w: hop %d: %d replacements tried", ErrNoReplacement, i, maxReplaceTries)
}

// pick asks for a replacement of hop i's worker at failed: the Replacer,
// else the first of the hop's addresses (the one dialled, then its
// alternates) that has not failed, or that failed and answers SERVING
// again. Called with r.mu held.
func (r *Route) pick(ctx context.Context, i int, failed string, cause error) (string, error) {
	if r.opts.Replace != nil {
		return r.opts.Replace(ctx, i, failed, cause)
	}
	var cands []string
	if i < len(r.opts.Alternates) {
		cands = append([]string{r.Hops[i].Addr}, r.opts.Alternates[i]...)
	}
	for _, a := range cands {
		if _, down := r.failed[a]; !down && a != failed {
			return a, nil
		}
	}
	for _, a := range cands {
		if a != failed && r.serving(ctx, a) {
			delete(r.failed, a)
			return a, nil
		}
	}
	return "", fmt.Errorf("%w: hop %d: every alternate (%s) failed", ErrNoReplacement, i, strings.Join(cands, ", "))
}

// serving asks the worker at addr for its health, within probeTimeout.
// Called with r.mu held.
func (r *Route) serving(ctx context.Context, addr string) bool {
	h, ok := r.pool[addr]
	if !ok {
		var err error
		if h, err = r.connect(addr); err != nil {
			return false
		}
		r.pool[addr] = h
	}
	return h.health(ctx) == nil
}

// pooled returns the pool's hop for addr with its report read again (a
// worker that came back may run another build), or connects one. Called
// with r.mu held.
func (r *Route) pooled(ctx context.Context, addr string) (*Hop, error) {
	timeout := min(r.opts.StepTimeout, 5*time.Second)
	h, ok := r.pool[addr]
	if !ok {
		var err error
		if h, err = r.dialHop(ctx, addr, timeout); h != nil {
			r.pool[addr] = h
		}
		return h, err
	}
	c, err := h.capability(ctx, timeout)
	if err != nil {
		return nil, err
	}
	if h.Capability == nil {
		h.Capability = c
	}
	h.current.Store(newHopState(c))
	return h, nil
}

// dialStandbys connects the standbys at Dial and reads their reports
// (within a second each): a standby that does not answer, or does not
// serve its hop, is marked failed (tried again once it answers SERVING).
func (r *Route) dialStandbys(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, alts := range r.opts.Alternates {
		if i >= len(r.Hops) {
			break
		}
		for _, a := range alts {
			if _, ok := r.pool[a]; ok {
				continue
			}
			h, err := r.connect(a)
			if err != nil {
				r.failed[a] = time.Now()
				continue
			}
			r.pool[a] = h
			if h.Capability, err = h.capability(ctx, probeTimeout); err == nil {
				h.current.Store(newHopState(h.Capability))
				err = r.fits(i, h)
			}
			if err != nil {
				r.failed[a] = time.Now()
			}
		}
	}
}

// fits requires h to serve hop i: validated, the route's model and the
// hop's layer range.
func (r *Route) fits(i int, h *Hop) error {
	want, c := r.Hops[i].Capability, h.Current()
	switch {
	case !c.GetValidated():
		return fmt.Errorf("%w: %s is not validated", ErrRoute, h.Addr)
	case c.GetFingerprint().GetModelArtifactDigest() != want.GetFingerprint().GetModelArtifactDigest():
		return fmt.Errorf("%w: %s serves another model", ErrRoute, h.Addr)
	case c.GetShardRange().GetStartLayer() != want.GetShardRange().GetStartLayer() ||
		c.GetShardRange().GetEndLayer() != want.GetShardRange().GetEndLayer():
		return fmt.Errorf("%w: %s serves layers %d-%d, not hop %d's", ErrRoute, h.Addr,
			c.GetShardRange().GetStartLayer(), c.GetShardRange().GetEndLayer(), i)
	}
	return nil
}

// health asks the hop for its state within probeTimeout: nil when it
// answers SERVING.
func (h *Hop) health(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	resp, err := h.client.Health(ctx, &shardv1.HealthRequest{SchemaVersion: shardv1.SchemaVersion_SCHEMA_VERSION_1})
	if err != nil {
		return fmt.Errorf("no answer to Health within %v", probeTimeout)
	}
	if st := resp.GetState(); st != shardv1.ServingState_SERVING_STATE_SERVING {
		return fmt.Errorf("it is %s", strings.TrimPrefix(st.String(), "SERVING_STATE_"))
	}
	return nil
}

// ParseRoute reads a route as the commands take it: hops in layer order,
// comma-separated, each an address or several separated by '|', the
// first the hop's worker and the others its standbys in order of
// preference ("a|a2,b|b2"). alternates is nil when no hop has one.
func ParseRoute(spec string) (addrs []string, alternates [][]string, err error) {
	some := false
	for _, hop := range strings.Split(spec, ",") {
		var alts []string
		for _, a := range strings.Split(hop, "|") {
			if a = strings.TrimSpace(a); a != "" {
				alts = append(alts, a)
			}
		}
		if len(alts) == 0 {
			if strings.TrimSpace(hop) == "" && len(strings.Split(spec, ",")) > 1 {
				return nil, nil, fmt.Errorf("route %q: an empty hop", spec)
			}
			continue
		}
		addrs = append(addrs, alts[0])
		alternates = append(alternates, alts[1:])
		some = some || len(alts) > 1
	}
	if len(addrs) == 0 {
		return nil, nil, fmt.Errorf("route %q: no hops", spec)
	}
	if !some {
		alternates = nil
	}
	return addrs, alternates, nil
}

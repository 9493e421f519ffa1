package llamacpp

/*
#include <stdlib.h>
#include "optime.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"slices"
	"time"
	"unsafe"

	"github.com/meshnet/shardd/gguf"
)

// TimeCost weighs the whole model at path, whose cost c is (gguf.ReadCost),
// by time on this CPU (gguf.Cost.Timed), in picoseconds a forward of rows
// rows (a stage's decode group: the sessions in flight over the stages)
// on threads threads: each layer is its weight matrices multiplied by the
// rows, with the model's own weights, plus with cells > 0 attention of its
// shape over cells cells a row; the head is its matrix. Every part runs
// reps times after a first run, the parts in a forward's order each time
// (so the weights stream through the caches as in a forward, and a change
// in the host's pace falls on all of them), and weighs the median of its
// runs. Norms, rope and the like are not counted.
func TimeCost(path string, c gguf.Cost, cells, rows, threads, reps int) (gguf.Cost, error) {
	if rows < 1 || threads < 1 || reps < 1 || cells < 0 {
		return gguf.Cost{}, fmt.Errorf("llamacpp: time cost: rows %d, threads %d, reps %d, cells %d", rows, threads, reps, cells)
	}
	initOnce.Do(func() { backendInit(false) })
	layers := len(c.Layers)
	cpath := C.CString(path)
	model := C.shardd_timed_model(cpath, C.int32_t(layers), C.int32_t(rows))
	C.free(unsafe.Pointer(cpath))
	if model == nil {
		return gguf.Cost{}, fmt.Errorf("llamacpp: cannot time the matrices of %s", path)
	}
	defer C.shardd_timed_free(model)
	// Attention by head count: its timer and the layers that have it.
	attn := map[int]*C.shardd_timed{}
	defer func() {
		for _, t := range attn {
			C.shardd_timed_free(t)
		}
	}()
	if cells > 0 && c.HeadDim > 0 {
		for _, h := range c.Heads {
			if _, ok := attn[h]; ok || h <= 0 {
				continue
			}
			t := C.shardd_timed_attention(C.int32_t(h), C.int32_t(c.HeadDim), C.int32_t(cells), C.int32_t(rows))
			if t == nil {
				return gguf.Cost{}, fmt.Errorf("llamacpp: cannot time attention of %d heads of %d over %d cells", h, c.HeadDim, cells)
			}
			attn[h] = t
		}
	}
	run := func(t *C.shardd_timed, part int) (time.Duration, error) {
		start := time.Now()
		switch C.shardd_timed_run(t, C.int32_t(part), C.int32_t(threads)) {
		case 0:
			return time.Since(start), nil
		case 1:
			return 0, nil // nothing to compute
		}
		return 0, errors.New("llamacpp: a timed op failed")
	}
	parts := make([][]time.Duration, layers+1) // the layers, then the head
	timed := len(parts)
	if c.Head == 0 {
		timed = layers // a shard before the last: its token embedding is no head
	}
	for r := range reps + 1 {
		for p := range timed {
			d, err := run(model, p)
			if err != nil {
				return gguf.Cost{}, err
			}
			if p < layers && p < len(c.Heads) && attn[c.Heads[p]] != nil {
				a, err := run(attn[c.Heads[p]], 0)
				if err != nil {
					return gguf.Cost{}, err
				}
				d += a
			}
			if r > 0 { // the first run pages the weights in
				parts[p] = append(parts[p], d)
			}
		}
	}
	// Layers of the same matrices and heads do the same work: each weighs
	// the median of all their runs, which the host's noise moves less than
	// one layer's (SmolLM2's layers' own medians spread 2.8-3.6 ms).
	type kind struct {
		shape uint64
		heads int
	}
	kinds := make([]kind, layers)
	pooled := map[kind][]time.Duration{}
	for p := range kinds {
		kinds[p].shape = uint64(C.shardd_timed_shape(model, C.int32_t(p)))
		if p < len(c.Heads) {
			kinds[p].heads = c.Heads[p]
		}
		pooled[kinds[p]] = append(pooled[kinds[p]], parts[p]...)
	}
	median := func(d []time.Duration) int64 {
		slices.Sort(d)
		return d[len(d)/2].Nanoseconds() * 1000
	}
	var head int64
	if timed > layers {
		head = median(parts[layers])
	}
	return c.Timed(func(i int) int64 { return median(pooled[kinds[i]]) }, head), nil
}

// Package llamacpp runs a shard's layer range on llama.cpp: upstream's
// tree as the PyPI sdist llama-cpp-python==0.3.36 vendors it (October 2026,
// commit 0c1e57098), with shardd's patches (scripts/llama-patches).
//
// llama.cpp and ggml are compiled once per machine into a static library,
// libshardd_llama.a, by scripts/llama-lib.sh (CMake), which the Makefile
// runs and points CGO_CPPFLAGS / CGO_LDFLAGS at; every Go build mode
// (plain, -race, fuzz) links that one library instead of recompiling the
// C++. This package creates the model and context through the C API
// itself (shim.c). Build with `make build`, or export the flags `make env`
// prints (README).
//
// How a layer range runs (see ../../shared/NOTES-llama.md):
//   - Input: the first shard takes token ids; the others take hidden states
//     as batch embeddings, which enter layer 0 of the shard unscaled.
//   - Output: the last shard returns logits. Every other shard captures the
//     residual stream "l_out-<n_layer-1>" with an eval callback, before the
//     tail norm (RMSNorm is not invertible), and stops the graph there. Every
//     row is flagged as an output so the last layer keeps all rows.
//   - Sessions are llama sequences in one context with a unified KV buffer,
//     so one decode call can carry rows of many sessions in batch order.
package llamacpp

/*
#cgo CFLAGS: -std=c11
#include <stdlib.h>
#include <string.h>
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/gguf"
)

// Version names the llama.cpp build for the runtime recipe digest: the
// upstream commit the pinned sdist (llama-cpp-python 0.3.36) vendors. The
// recipe's build line (Build) adds the sdist's digest and the patches.
const Version = "llama.cpp/0c1e57098"

// Config sizes the context.
type Config struct {
	// Path is the shard (or whole model) GGUF.
	Path string
	// Threads for the forward pass; 0 means runtime.NumCPU().
	Threads int
	// MaxSeqs is the number of sessions that may hold state at once (<= 256).
	MaxSeqs int
	// CtxTokens is the KV capacity in tokens shared by all sessions; 0 means
	// the model's context length.
	CtxTokens int
	// MaxBatch is the most rows one forward call takes; 0 means 512.
	MaxBatch int
	// Poll is the CPU threadpool's polling level after a forward, 0..100.
	// Spinning threads answer the next forward sooner, but they burn the
	// cores: where several workers (or anything else) share a machine, an
	// idle worker's spinning slows the busy one. 0 (the default) sleeps.
	Poll int
	// PinThreads pins the compute threads one per CPU: the threadpool's
	// threads for good, and the thread that calls a forward (a Go thread,
	// which runs other goroutines in between) for the forward's length.
	// ggml's threads wait for each other at spinning barriers many times per
	// forward; when the scheduler puts two of them on one CPU, each barrier
	// waits out a time slice. Ignored when Threads is 1 (no barrier) or
	// exceeds the CPUs this process may use. Backends pinned in one process
	// all take the same CPUs (the first Threads allowed ones): run their
	// forwards one at a time.
	PinThreads bool
	// Verbose passes llama.cpp's info logs through.
	Verbose bool
	// RoundBF16 lists layers (of this file, from 0) whose output, the
	// residual stream l_out-<i>, is rounded to bf16 in place as soon as it
	// is computed, as the wire rounds it at a bf16 boundary after layer i:
	// the whole model then computes what such a route computes, the
	// reference `verify` compares a bf16 route with bitwise. Never set on
	// a serving worker.
	RoundBF16 []int
	// GPULayers puts that many of the shard's layers, from the last, and
	// their KV cache on a GPU (AllLayers: every layer and the output
	// layer); 0 keeps everything on the CPU. With no such device Open
	// fails with ErrNoGPU.
	GPULayers int
	// Device picks the GPU: its index among GPUs() or its name ("CUDA0");
	// "" is the first.
	Device string
	// SeparateKV gives each sequence a KV stream of its own
	// (CtxTokens/MaxSeqs cells) instead of one buffer shared by all, so a
	// sequence's cells lie in position order, as they would if it were
	// alone (flash attention sums over them in cell order): the exact
	// mode's layout (engine.Config.Exact). A forward then
	// carries the rows of one sequence, or as many rows of each of several
	// (decode steps, prompt chunks of one length; see streams).
	SeparateKV bool
}

var initOnce sync.Once

// backendInit sets llama.cpp's logger and initialises its backends, once.
func backendInit(verbose bool) {
	v := 0
	if verbose {
		v = 1
	}
	C.shardd_backend_init(C.int(v))
}

// Backend is a loaded shard. It is not safe for concurrent use.
type Backend struct {
	info  backend.Info
	meta  gguf.Meta
	model *C.struct_llama_model
	ctx   *C.struct_llama_context
	tp    *C.struct_ggml_threadpool
	cap   *C.shardd_capture // nil on logit-producing shards
	pre   *C.shardd_preempt // C memory: written atomically from Go and read by llama.cpp
	// mainCPU is the CPU a forward's calling thread is pinned to; -1: none.
	mainCPU C.int32_t
	// ubatch is the most rows llama.cpp computes in one graph.
	ubatch int
	// streams lays out forwards of several sequences (SeparateKV only).
	streams     *streams
	streamStats streamStats
}

var _ backend.Preemptible = (*Backend)(nil)

var _ backend.Backend = (*Backend)(nil)

// Open loads the GGUF at cfg.Path and creates its context.
func Open(cfg Config) (*Backend, error) {
	meta, err := gguf.Read(cfg.Path)
	if err != nil {
		return nil, err
	}
	return OpenMeta(cfg, meta)
}

// OpenMeta is Open for a file whose metadata the caller already read.
func OpenMeta(cfg Config, meta gguf.Meta) (*Backend, error) {
	initOnce.Do(func() { backendInit(cfg.Verbose) })
	if cfg.Threads <= 0 {
		cfg.Threads = runtime.NumCPU()
	}
	if cfg.MaxSeqs <= 0 {
		cfg.MaxSeqs = 16
	}
	if cfg.MaxSeqs > 256 {
		return nil, fmt.Errorf("llamacpp: at most 256 sequences (LLAMA_MAX_SEQ), not %d", cfg.MaxSeqs)
	}
	if cfg.CtxTokens <= 0 {
		cfg.CtxTokens = meta.ContextLen
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = 512
	}

	gpu, ngl, err := placement(cfg, meta.BlockCount)
	if err != nil {
		return nil, err
	}
	b := &Backend{meta: meta}
	b.model = loadModel(cfg.Path, gpu, ngl)
	if b.model == nil {
		return nil, fmt.Errorf("llamacpp: llama.cpp could not load %s (see log)", shortName(cfg.Path))
	}
	name, device := Version+" cpu", cpuName()
	if gpu != nil {
		name = fmt.Sprintf("%s %s %d/%d", Version, GPUBuild(), ngl, meta.BlockCount+1)
		device = gpuDevice(gpu, ngl, meta.BlockCount)
	}
	b.info = backend.Info{
		TokensIn:  meta.First(),
		LogitsOut: meta.Last(),
		Hidden:    int(C.llama_model_n_embd(b.model)),
		Vocab:     int(C.llama_vocab_n_tokens(C.llama_model_get_vocab(b.model))),
		Layers:    int(C.llama_model_n_layer(b.model)),
		MaxSeqs:   cfg.MaxSeqs,
		CtxTokens: cfg.CtxTokens,
		MaxBatch:  cfg.MaxBatch,
		Threads:   cfg.Threads,
		Name:      name,
		Device:    device,
		Kernels:   Kernels(),
	}
	if b.info.Layers != meta.BlockCount {
		b.Close()
		return nil, fmt.Errorf("llamacpp: loaded %d layers, file declares %d", b.info.Layers, meta.BlockCount)
	}
	if !b.info.LogitsOut || len(cfg.RoundBF16) > 0 {
		b.cap = (*C.shardd_capture)(C.calloc(1, C.size_t(unsafe.Sizeof(C.shardd_capture{}))))
	}
	for _, l := range cfg.RoundBF16 {
		if l < 0 || l >= b.info.Layers-1 || l >= len(b.cap.round_bf16) {
			b.Close()
			return nil, fmt.Errorf("llamacpp: cannot round the output of layer %d of %d", l, b.info.Layers)
		}
		b.cap.round_bf16[l], b.cap.any_round = 1, 1
	}
	if !b.info.LogitsOut {
		name := fmt.Sprintf("l_out-%d", b.info.Layers-1)
		cname := C.CString(name)
		C.strncpy(&b.cap.name[0], cname, C.size_t(len(b.cap.name)-1))
		C.free(unsafe.Pointer(cname))
		n := cfg.MaxBatch * b.info.Hidden
		b.cap.dst = (*C.float)(C.malloc(C.size_t(n * 4)))
		b.cap.cap_floats = C.int64_t(n)
	}
	b.ubatch = min(cfg.MaxBatch, 512)
	b.ctx = C.shardd_new_context(b.model, C.uint32_t(cfg.CtxTokens), C.uint32_t(cfg.MaxBatch),
		C.uint32_t(b.ubatch), C.uint32_t(cfg.MaxSeqs), C.int32_t(cfg.Threads), C.bool(!cfg.SeparateKV), b.cap)
	if b.ctx == nil {
		b.Close()
		return nil, errors.New("llamacpp: could not create a context (see log)")
	}
	b.pre = (*C.shardd_preempt)(C.calloc(1, C.size_t(unsafe.Sizeof(C.shardd_preempt{}))))
	C.shardd_set_preempt(b.ctx, b.pre)
	if b.tp = C.shardd_attach_threadpool(b.ctx, C.int32_t(cfg.Threads), C.uint32_t(min(max(cfg.Poll, 0), 100)),
		C.bool(cfg.PinThreads), &b.mainCPU); b.tp == nil {
		b.Close()
		return nil, errors.New("llamacpp: could not create a threadpool")
	}
	if cfg.SeparateKV {
		st, err := newStreams(b)
		if err != nil {
			b.Close()
			return nil, err
		}
		b.streams = st
		exactBackends(+1)
	}
	return b, nil
}

// exactOpen counts the open backends that need batch-invariant forwards
// (SeparateKV: the exact mode). While there is one, ggml's tiled K-quant
// matmul is off for the whole process: it takes batches of 8 rows or more
// and vec_dot fewer, which round differently, so a K-quant model's row
// would have other bits beside 7 other rows than alone. Elsewhere it stays
// on: a batch of rows takes the same kernels wherever the same shapes run
// (a route's shards and the whole model alike).
var exactOpen struct {
	sync.Mutex
	n int
}

func exactBackends(d int) {
	exactOpen.Lock()
	defer exactOpen.Unlock()
	exactOpen.n += d
	C.ggml_cpu_shardd_set_tiled(C.bool(exactOpen.n == 0))
}

// PinAuto is the default for Config.PinThreads: pin when a forward's
// threads take every CPU this process may run on (threads 0 means all), the
// case where the scheduler has no spare CPU to separate two compute threads
// it put together.
func PinAuto(threads int) bool { return threads == 0 || threads == runtime.NumCPU() }

// Pinned reports whether the compute threads are pinned (Config.PinThreads,
// when it applies).
func (b *Backend) Pinned() bool { return b.mainCPU >= 0 }

// Info describes the loaded shard.
func (b *Backend) Info() backend.Info { return b.info }

// Meta is the GGUF metadata the shard was opened with.
func (b *Backend) Meta() gguf.Meta { return b.meta }

// Close frees the context and model. Close is idempotent.
func (b *Backend) Close() error {
	if b.streams != nil {
		b.FreeBatch(b.streams.batch)
		b.streams = nil
		exactBackends(-1)
	}
	if b.ctx != nil {
		C.llama_free(b.ctx)
		b.ctx = nil
	}
	if b.tp != nil {
		C.shardd_threadpool_free(b.tp)
		b.tp = nil
	}
	if b.model != nil {
		C.llama_model_free(b.model)
		b.model = nil
	}
	if b.cap != nil {
		C.free(unsafe.Pointer(b.cap.dst)) // nil when only rounding
		C.free(unsafe.Pointer(b.cap))
		b.cap = nil
	}
	if b.pre != nil {
		C.free(unsafe.Pointer(b.pre))
		b.pre = nil
	}
	return nil
}

func (b *Backend) preemptWord() *int32 { return (*int32)(unsafe.Pointer(&b.pre.preempt)) }
func (b *Backend) enabledWord() *int32 { return (*int32)(unsafe.Pointer(&b.pre.enabled)) }

// Preempt asks the running or next preemptible forward to stop.
func (b *Backend) Preempt() { atomic.StoreInt32(b.preemptWord(), 1) }

// ForwardPreemptible runs the batch unless Preempt is called while it runs.
// Requests made before it started are dropped: the caller drained its queue
// just before, so they were for work it has already seen.
func (b *Backend) ForwardPreemptible(bb backend.Batch, out *backend.Output) error {
	atomic.StoreInt32(b.preemptWord(), 0)
	atomic.StoreInt32(b.enabledWord(), 1)
	defer atomic.StoreInt32(b.enabledWord(), 0)
	return b.forward(bb, out)
}

// SeqTrim removes positions >= from of seq; from 0 frees it.
func (b *Backend) SeqTrim(seq, from int) error {
	if seq < 0 || seq >= b.info.MaxSeqs {
		return fmt.Errorf("%w: sequence %d", backend.ErrInput, seq)
	}
	if !C.shardd_seq_rm(b.ctx, C.int32_t(b.kvSeq(seq)), C.int32_t(from)) {
		return fmt.Errorf("%w: could not trim sequence %d", backend.ErrForward, seq)
	}
	if from == 0 && b.streams != nil {
		b.streams.outside[seq] = 0
	}
	if from == 0 && b.streams == nil {
		// The shared buffer emptied: its next cells start from cell 0,
		// as a fresh context's do, so a session that then runs alone lays
		// its cells in position order, every one after the last (llama.cpp
		// otherwise searches from the lowest cell last freed and, with
		// enough room below, from 0: a session started at cell 60 would
		// put its first decode step's cell before its prompt's).
		C.shardd_reset_if_empty(b.ctx, C.int32_t(b.info.MaxSeqs))
	}
	return nil
}

// kvSeq is llama.cpp's sequence id for the engine's sequence seq: its KV
// stream on separate streams (see streams), else seq.
func (b *Backend) kvSeq(seq int) C.llama_seq_id {
	if b.streams != nil {
		return C.llama_seq_id(b.streams.stream[seq])
	}
	return C.llama_seq_id(seq)
}

var _ backend.StreamStater = (*Backend)(nil)

// StreamStats reports, on separate KV streams, the placeholder rows run
// and the streams copied to bring a forward's sequences together (see
// streams); zeros otherwise. Safe to call from any goroutine.
func (b *Backend) StreamStats() (placeholders, copies int64) {
	return b.streamStats.placeholders.Load(), b.streamStats.copies.Load()
}

// Forward runs b over the batch and fills out. It is never preempted, and it
// clears pending preemption requests: the work they were for is about to be
// served (the engine preempts only to get decode steps in).
func (b *Backend) Forward(bb backend.Batch, out *backend.Output) error {
	atomic.StoreInt32(b.preemptWord(), 0)
	return b.forward(bb, out)
}

func (b *Backend) forward(bb backend.Batch, out *backend.Output) error {
	bt, ok := bb.(*batch)
	if !ok || bt.owner != b {
		return fmt.Errorf("%w: batch from another backend", backend.ErrInput)
	}
	out.Hidden, out.Logits = nil, out.Logits[:0]
	if bt.n == 0 {
		return nil
	}
	run := bt
	if b.streams != nil {
		var err error
		if run, err = b.streams.layout(b, bt); err != nil {
			return err
		}
		defer b.streams.release(b)
	}
	padded := run != bt
	if b.cap != nil {
		b.cap.n_floats, b.cap.bad = 0, 0 // each part's rows append
	}
	if b.info.LogitsOut {
		out.Logits = slices.Grow(out.Logits[:0], bt.outs*b.info.Vocab)[:bt.outs*b.info.Vocab]
	}
	from := 0
	if padded {
		for _, to := range b.streams.cuts {
			if err := b.decodePart(bt, run, from, to, out); err != nil {
				return err
			}
			from = to
		}
	}
	if err := b.decodePart(bt, run, from, run.n, out); err != nil {
		return err
	}
	if !b.info.LogitsOut {
		want := run.n * b.info.Hidden
		if b.cap.bad != 0 || int(b.cap.n_floats) != want {
			return fmt.Errorf("%w: captured %d of %d values (code %d)", backend.ErrForward, int64(b.cap.n_floats), want, int(b.cap.bad))
		}
		out.Hidden = unsafe.Slice((*float32)(unsafe.Pointer(b.cap.dst)), want)
		if padded {
			out.Hidden = b.streams.gather(out.Hidden, bt.n, b.info.Hidden)
		}
	}
	return nil
}

// decodePart runs rows [from, to) of run, the batch laid out for bt
// (bt itself, or its padded layout), as one llama_decode, and copies the
// logits of bt's output rows among them to their places in out.Logits
// (sized for every output row of bt).
func (b *Backend) decodePart(bt, run *batch, from, to int, out *backend.Output) error {
	c := run.c
	if from > 0 {
		if run.embd == 0 {
			c.token = &run.tokens[from]
		} else {
			c.embd = (*C.float)(unsafe.Pointer(&run.hidden[from*run.embd]))
		}
		c.pos, c.n_seq_id, c.seq_id, c.logits = &run.pos[from], &run.nSeq[from], &run.seq[from], &run.logits[from]
	}
	c.n_tokens = C.int32_t(to - from)
	if err := b.decode(c); err != nil {
		return err
	}
	if !b.info.LogitsOut {
		return nil
	}
	vocab, slot := b.info.Vocab, 0
	for i, flag := range bt.logits[:bt.n] {
		if flag == 0 {
			continue
		}
		j := i
		if run != bt {
			j = b.streams.at[i]
		}
		if j >= from && j < to {
			p := C.llama_get_logits_ith(b.ctx, C.int32_t(j-from))
			if p == nil {
				return fmt.Errorf("%w: no logits for row %d", backend.ErrForward, i)
			}
			copy(out.Logits[slot*vocab:(slot+1)*vocab], unsafe.Slice((*float32)(unsafe.Pointer(p)), vocab))
		}
		slot++
	}
	return nil
}

// decode runs llama_decode over c and maps its result to the backend's
// errors.
func (b *Backend) decode(c C.struct_llama_batch) error {
	switch rc := C.shardd_decode(b.ctx, c, b.mainCPU); {
	case rc == 2:
		return backend.ErrPreempted
	case rc == 1:
		return backend.ErrKVFull
	case rc == -1:
		return fmt.Errorf("%w (llama_decode rejected the batch)", backend.ErrPosition)
	case rc != 0:
		return fmt.Errorf("%w: llama_decode returned %d", backend.ErrForward, int(rc))
	}
	if b.cap != nil && b.cap.bad != 0 {
		return fmt.Errorf("%w: eval callback failed (code %d)", backend.ErrForward, int(b.cap.bad))
	}
	return nil
}

func shortName(path string) string {
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		return path[i+1:]
	}
	return path
}

// cpuName reports the CPU model for the capability report, e.g.
// "cpu:AMD EPYC".
func cpuName() string {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return "cpu:" + strings.TrimSpace(v)
			}
		}
	}
	return "cpu:" + runtime.GOARCH
}

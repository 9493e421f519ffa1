package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/engine/sched"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/decode"
	"github.com/meshnet/shardd/stages/dtype"
	"github.com/meshnet/shardd/stages/frameout"
	"github.com/meshnet/shardd/stages/reassemble"
	"github.com/meshnet/shardd/stages/receive"
)

// Engine serves one shard. Create it with New, serve it with Register, stop
// it with Drain and Close.
type Engine struct {
	shardv1.UnimplementedShardRuntimeServer

	cfg    Config
	be     backend.Backend
	recipe Recipe // what id's recipe digest digests
	// features are the optional behaviours this worker advertises and
	// accepts (Config.Withhold left out).
	features feature.Set
	info     backend.Info
	id       Identity
	pool     *bufpool.Pool
	recv     *receive.Pipeline
	framer   *frameout.Framer
	log      *slog.Logger

	validated   bool
	validatedAt time.Time
	detail      string // sanitized reason when not validated

	state   atomic.Int32 // shardv1.ServingState
	submitQ chan *work
	control chan func()
	queued  atomic.Int32 // work submitted and not yet replied
	// openStreams counts Session streams being served (Drain waits for
	// them: a generation between two steps has nothing queued).
	openStreams atomic.Int32
	stop        chan struct{}
	stopped     chan struct{}
	streams     sync.WaitGroup

	// published: the scheduler's figures for Health and the metrics.
	published published

	obs observer

	// Owned by the scheduler goroutine (drv.run): the state that decides
	// and the driver that runs the backend.
	sched *sched.Scheduler
	drv   driver
	// schedMu is held by the scheduler goroutine except while it waits:
	// on its channels, or on a forward. open takes it to read admission
	// without waiting out a forward; nothing else touches sched.
	schedMu sync.Mutex
}

// New creates an engine over a loaded backend and runs the capability
// probe: a bounded real forward. A failed probe leaves the engine
// NOT_SERVING with a sanitized reason; it still answers GetCapability and
// Health.
func New(cfg Config, be backend.Backend, meta gguf.Meta, log *slog.Logger) *Engine {
	info := be.Info()
	cfg = cfg.Defaults().forBackend(info)
	if log == nil {
		log = slog.Default()
	}
	pool := bufpool.Default
	e := &Engine{
		cfg:    cfg,
		be:     be,
		info:   info,
		recipe: RecipeFor(info, meta, cfg.Boundary, cfg.Exact),
		pool:   pool,
		recv: receive.New(receive.Config{
			Budget:   reassemble.Budget{MaxTensorBytes: cfg.MaxTensorBytes},
			Checksum: checksum.Policy{Require: cfg.RequireChecksum},
		}, pool),
		framer:  frameout.New(pool),
		log:     log,
		submitQ: make(chan *work, cfg.MaxQueue),
		control: make(chan func(), 64),
		stop:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
	e.id = NewIdentity(meta, e.recipe, cfg.Version)
	e.features = feature.Without(cfg.Withhold)
	e.initObserver(cfg.TracerProvider, cfg.MeterProvider)
	if err := backend.Probe(be); err != nil {
		e.detail = "capability probe failed: the shard could not run a forward pass"
		e.log.Error("capability probe failed", "err", err)
		e.state.Store(int32(shardv1.ServingState_SERVING_STATE_NOT_SERVING))
	} else {
		e.validated, e.validatedAt = true, time.Now()
		e.state.Store(int32(shardv1.ServingState_SERVING_STATE_SERVING))
	}
	e.initSched()
	if err := e.drv.init(e); err != nil {
		e.detail = "could not allocate the forward batch"
		e.validated = false
		e.state.Store(int32(shardv1.ServingState_SERVING_STATE_NOT_SERVING))
	}
	go e.drv.run()
	return e
}

// Identity is what the engine serves.
func (e *Engine) Identity() Identity { return e.id }

// State is the serving state.
func (e *Engine) State() shardv1.ServingState { return shardv1.ServingState(e.state.Load()) }

// Drain refuses new sessions and waits until the streams already open have
// ended (their initiators finished their generations) and no work is
// queued, or ctx ends. Open streams keep being served meanwhile, and so
// are Health and the unary calls, which report DRAINING.
func (e *Engine) Drain(ctx context.Context) error {
	e.state.CompareAndSwap(int32(shardv1.ServingState_SERVING_STATE_SERVING), int32(shardv1.ServingState_SERVING_STATE_DRAINING))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for e.queued.Load() > 0 || e.openStreams.Load() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("engine: drain: %d work items queued, %d streams open", e.queued.Load(), e.openStreams.Load())
		case <-tick.C:
		}
	}
	return nil
}

// Close stops the scheduler, dropping queued work, and frees what the engine
// holds. The caller stops the gRPC server first. The backend stays open.
func (e *Engine) Close() {
	select {
	case <-e.stop:
		return
	default:
	}
	close(e.stop)
	<-e.stopped
	e.streams.Wait()
	e.obs.stopRecorder()
	e.recv.Close()
	e.framer.Close()
}

// do runs op on the scheduler goroutine and waits for it.
func (e *Engine) do(ctx context.Context, op func()) error {
	done := make(chan struct{})
	select {
	case e.control <- func() { op(); e.drv.settle(0); close(done) }:
	case <-ctx.Done():
		return ctx.Err()
	case <-e.stopped:
		return ErrCancelled
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-e.stopped:
		return ErrCancelled
	}
}

var inboundPool = sync.Pool{New: func() any { return new(decode.Inbound) }}

// initSched makes the scheduler's state for this engine's settings and
// backend, with the prefix cache where the backend can copy KV state.
func (e *Engine) initSched() {
	cfg, info := &e.cfg, &e.info
	e.sched = sched.New(sched.Config{
		Exact: cfg.Exact, MaxSessions: cfg.MaxSessions, SessionTTL: cfg.SessionTTL, EvictGrace: cfg.EvictGrace,
		ResultsCacheBytes: cfg.ResultsCacheBytes, MaxInflightChunks: cfg.MaxInflightChunks,
		IterationTokens: cfg.IterationTokens, PrefillIterationTokens: cfg.PrefillIterationTokens,
		DecodeBudget: cfg.DecodeBudget, DecodeQuiet: cfg.DecodeQuiet, GatherWindow: cfg.GatherWindow,
		DecodeGroups: cfg.DecodeGroups,
	}, sched.Info{MaxSeqs: info.MaxSeqs, CtxTokens: info.CtxTokens, MaxBatch: info.MaxBatch, LogitsOut: info.LogitsOut},
		e.pool, sched.Hooks{Complete: e.complete}, time.Now())
	if _, ok := e.be.(backend.SeqStater); !ok || cfg.PrefixCacheBytes <= 0 {
		return
	}
	rowBytes, boundary := 0, "bf16"
	if cfg.Boundary == shardv1.DType_DTYPE_FLOAT32 {
		boundary = "f32"
	}
	if !info.LogitsOut {
		rowBytes = dtype.Size(cfg.Boundary) * info.Hidden
	}
	e.sched.EnablePrefix(sched.PrefixConfig{Bytes: cfg.PrefixCacheBytes, Block: cfg.PrefixBlock, RowBytes: rowBytes, Seed: prefixSeed(e.id, boundary)})
}

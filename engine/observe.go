package engine

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/meshnet/shardd/backend"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tracectx"
	"github.com/meshnet/shardd/stages/receive"
)

// Stage names: one span (and one histogram series) per stage per unit of
// work.
const (
	stageDecode     = "decode"
	stageReassemble = "reassemble"
	stageDecompress = "decompress"
	stageChecksum   = "checksum"
	stageQueue      = "queue"
	stageForward    = "forward"
	stageFrameOut   = "frameout"
)

// timings are a unit of work's stage boundaries. They are taken with
// time.Now only when the engine observes (tracing or metrics).
type timings struct {
	decodeStart, decodeEnd time.Time
	recv                   receive.Timings
	submitted              time.Time
	started                time.Time // first forward
	completed              time.Time
	coreGBps               float64 // the forward thread's core speed (sched.Stats.CoreGBps)
}

// observer holds the engine's tracer and instruments. With neither tracing
// nor metrics configured, on is false and nothing is timed or recorded.
type observer struct {
	on     bool
	tracer trace.Tracer // nil: tracing off
	stage  metric.Float64Histogram
	// occupancy: rows per forward call, recorded by the scheduler (nil
	// without metrics).
	occupancy metric.Int64Histogram
	errs      metric.Int64Counter
	bytesIn   metric.Int64Counter
	bytesOut  metric.Int64Counter
	// stageOpt holds each stage's attribute set, made once: recording with
	// a fresh attribute per call would allocate on every step.
	stageOpt map[string][]metric.RecordOption

	records      chan stepRecord // to the recorder goroutine
	armed        atomic.Bool     // the recorder was woken for the queued records
	wake, hurry  chan struct{}   // one-slot signals to the recorder
	stopRec      chan struct{}
	recorderDone chan struct{}
	dropped      atomic.Int64 // steps not recorded: the queue was full
}

func (e *Engine) initObserver(tp trace.TracerProvider, mp metric.MeterProvider) {
	o := &e.obs
	if tp != nil {
		o.tracer = tp.Tracer("github.com/meshnet/shardd/engine")
	}
	if mp == nil && tp == nil {
		return
	}
	o.on = true
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	}
	m := mp.Meter("github.com/meshnet/shardd/engine")
	o.stage, _ = m.Float64Histogram("shardd.stage.duration", metric.WithUnit("s"),
		metric.WithDescription("time a unit of work spent in each stage"),
		metric.WithExplicitBucketBoundaries(1e-6, 5e-6, 2e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01, 0.05, 0.1, 0.5, 1, 5))
	// Passing a ready slice with ... costs nothing; building the variadic
	// slice per call escapes through the interface and allocates.
	o.stageOpt = map[string][]metric.RecordOption{}
	for _, st := range []string{stageDecode, stageReassemble, stageDecompress, stageChecksum, stageQueue, stageForward, stageFrameOut} {
		o.stageOpt[st] = []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("stage", st)))}
	}
	o.errs, _ = m.Int64Counter("shardd.errors", metric.WithDescription("units of work refused, by ErrorCode"))
	o.bytesIn, _ = m.Int64Counter("shardd.received", metric.WithUnit("By"), metric.WithDescription("serialized work messages received"))
	o.bytesOut, _ = m.Int64Counter("shardd.sent.payload", metric.WithUnit("By"), metric.WithDescription("result tensor bytes sent"))
	gauge := func(name, desc string, f func() float64) {
		m.Float64ObservableGauge(name, metric.WithDescription(desc),
			metric.WithFloat64Callback(func(_ context.Context, obs metric.Float64Observer) error {
				obs.Observe(f())
				return nil
			}))
	}
	gauge("shardd.queue.depth", "work items queued or running", func() float64 { return float64(e.queued.Load()) })
	gauge("shardd.batch.occupancy", "rows in the last forward call", func() float64 { return float64(e.Stats().Occupancy) })
	gauge("shardd.kv.pressure", "fraction of the KV token budget held or reserved", func() float64 { return e.Stats().Pressure })
	gauge("shardd.sessions", "route sessions holding KV state", func() float64 { return float64(e.Stats().Sessions) })
	gauge("shardd.buffers.outstanding", "pooled buffers handed out and not yet returned (held by queued work, results in flight and the results cache; one gRPC dropped unsent comes back at a GC)",
		func() float64 { return float64(e.pool.Outstanding()) })
	gauge("shardd.results.bytes", "bytes of finished results held to answer duplicate steps (bounded by --results-cache-bytes)", func() float64 { return float64(e.Stats().ResultsBytes) })
	counter := func(name, desc string, f func() int64) {
		m.Int64ObservableCounter(name, metric.WithDescription(desc),
			metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
				obs.Observe(f())
				return nil
			}))
	}
	counter("shardd.evictions", "sessions evicted by budget or TTL", func() int64 { return e.Stats().Evictions })
	counter("shardd.sessions.admitted", "sessions admitted at their first prefill (with the KV tokens they stated reserved)", func() int64 { return e.Stats().Admitted })
	counter("shardd.sessions.refused", "sessions refused at their first prefill, retryably: no session slot, or no room for the KV tokens they stated", func() int64 { return e.Stats().Refused })
	counter("shardd.sessions.preempted", "idle sessions dropped so that an admitted session's step could grow (their next step is a declared CACHE_MISS)", func() int64 { return e.Stats().SessionsPreempted })
	counter("shardd.sessions.reprefilled", "sessions prefilled again from position 0 after their state was lost", func() int64 { return e.Stats().Reprefilled })
	gauge("shardd.cost.base", "cost model: fixed seconds of a forward", func() float64 { return e.Stats().CostBase })
	gauge("shardd.cost.per_row", "cost model: seconds per batch row", func() float64 { return e.Stats().CostPerRow })
	counter("shardd.decode_budget.iterations", "iterations with decode rows under a decode budget", func() int64 { return e.Stats().BudgetRuns })
	counter("shardd.decode_budget.kept", "of those, iterations whose forward kept the budget", func() int64 { return e.Stats().BudgetHits })
	counter("shardd.gather.holds", "decode iterations that waited for their group's share of the decoding sessions (--decode-groups)", func() int64 { return e.Stats().Holds })
	counter("shardd.gather.expired", "of those, holds that ran out their --gather-window before the group formed", func() int64 { return e.Stats().HoldsExpired })
	gauge("shardd.gather.held", "seconds decode iterations have waited for their groups since start", func() float64 { return e.Stats().Held.Seconds() })
	counter("shardd.prefix.hits", "prefill chunks that took rows from the prefix cache", func() int64 { return e.Stats().PrefixHits })
	counter("shardd.prefix.tokens", "prompt positions answered from the prefix cache instead of a forward", func() int64 { return e.Stats().PrefixTokens })
	counter("shardd.prefix.misfits", "prefix cache loads that found no room in the KV cache (their rows ran instead)", func() int64 { return e.Stats().PrefixMisfits })
	counter("shardd.prefix.unordered", "prefix cache entries made shorter than their prompt, or not made, because the sequence's cells were missing or out of position order past some block (not a lone run's bits)", func() int64 { return e.Stats().PrefixUnordered })
	gauge("shardd.prefix.bytes", "bytes of KV state and output rows the prefix cache holds (bounded by --prefix-cache-bytes)", func() float64 { return float64(e.Stats().PrefixBytes) })
	gauge("shardd.cost.beside_row", "measured seconds of a prefill row beside decode rows (what prefill beside a decode step is priced at)", func() float64 { return e.Stats().BesideRow.Seconds() })
	counter("shardd.prefill.beside_probes", "decode iterations that took --iteration-tokens prefill rows while waiting prompts got none at the measured price, to price them again", func() int64 { return e.Stats().BesideProbes })
	counter("shardd.prefill.crowds", "iterations that took --prefill-iteration-tokens of prompt tokens whatever the decode budget, for a crowd of short prompts or their chunks: at least two, more than two thirds as many as the sessions decoding", func() int64 { return e.Stats().Crowds })
	counter("shardd.decode_due.waits", "prefill-only iterations not started because a decode step was due before one prefill token would finish", func() int64 { return e.Stats().DueWaits })
	if ss, ok := e.be.(backend.StreamStater); ok {
		counter("shardd.streams.placeholder_rows", "--exact: rows run only to fill a gap between the KV streams of a forward's sessions",
			func() int64 { n, _ := ss.StreamStats(); return n })
		counter("shardd.streams.copies", "--exact: KV streams copied to bring a forward's sessions onto consecutive streams",
			func() int64 { _, n := ss.StreamStats(); return n })
	}
	o.occupancy, _ = m.Int64Histogram("shardd.batch.rows", metric.WithDescription("rows in each forward call"),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512))
	gauge("shardd.host.core_speed", "GB/s of an L1 copy on the forward thread's core, probed at most every 100 ms before a forward: on a shared host a forward's time follows it, so a slow hop on a slow core is the host's", func() float64 { return e.Stats().CoreGBps })
	if ip := e.cfg.IdlePoll; ip != nil {
		gauge("shardd.idle_poll.spun", "seconds the --idle-poll threads have spun on the forward's CPUs since start, at the lowest priority (CPU time a halted vCPU would have given the host)", func() float64 { return ip.Spun().Seconds() })
	}
	counter("shardd.frameout.waits", "forwards that first waited for the last forward's results to be sent (a hop's next forward would hold its CPU from the senders)", func() int64 { return e.Stats().SendWaits })
	counter("shardd.frameout.waits_expired", "of those, waits that gave up at their 2 ms bound (a peer slow to read: forwards then stop waiting until every result counted since has left)", func() int64 { return e.Stats().SendWaitsExpired })
	gauge("shardd.frameout.waited", "seconds forwards have waited for the last forward's results to be sent since start", func() float64 { return e.Stats().SendWaited.Seconds() })
	gauge("shardd.forward.busy", "seconds spent in forward calls since start (its rate is the backend's utilization)", func() float64 { return e.Stats().Busy.Seconds() })
	counter("shardd.preemptions", "prefill iterations stopped for a decode step", func() int64 { return e.Stats().Preemptions })
	counter("shardd.telemetry.dropped", "finished steps whose spans and stage durations were dropped: the recorder's queue was full", o.dropped.Load)
	o.records = make(chan stepRecord, recordQueue)
	o.wake, o.hurry = make(chan struct{}, 1), make(chan struct{}, 1)
	o.stopRec, o.recorderDone = make(chan struct{}), make(chan struct{})
	go o.runRecorder()
}

// recordOccupancy records one forward call's rows.
func (o *observer) recordOccupancy(rows int) {
	if o.occupancy != nil {
		o.occupancy.Record(context.Background(), int64(rows))
	}
}

// sessionContext returns the context a stream's spans hang from: a server
// span for the stream, parented to the trace context the initiator sent in
// the stream's metadata (see internal/tracectx). Without tracing it returns
// ctx and a no-op end.
func (e *Engine) sessionContext(ctx context.Context) (context.Context, func()) {
	if e.obs.tracer == nil {
		return ctx, func() {}
	}
	ctx, span := e.obs.tracer.Start(tracectx.Extract(ctx), "shardd.session", trace.WithSpanKind(trace.SpanKindServer))
	return ctx, func() { span.End() }
}

// stepRecord is what recording needs of a finished step, copied out of the
// result (which the send goroutine releases right after sending).
type stepRecord struct {
	ctx                  context.Context // the stream's: its span is the parent
	tm                   timings
	sent                 time.Time
	workID, session      string
	mode                 shardv1.CacheMode
	step, epoch, pastLen uint64
	tokens, first        int
	bytesIn, bytesOut    int
	cacheHit             bool
	prefixRows           int
	flushed              chan struct{} // set on a flush marker: closed when reached
}

// recordQueue bounds the steps waiting for the recorder. When it is full
// (the recorder cannot keep up) a step's spans and stage durations are
// dropped and counted in shardd.telemetry.dropped rather than delaying the
// data plane.
const recordQueue = 4096

// recordStep hands a finished step to the recorder goroutine. It runs on
// the stream's send goroutine after the result went out: the spans and
// histograms are made elsewhere so that the next reply never waits on them.
func (st *stream) recordStep(r *result, sent time.Time) {
	o := &st.e.obs
	if !o.on {
		return
	}
	rec := stepRecord{
		ctx: st.ctx, tm: r.tm, sent: sent,
		workID: strings.Clone(r.workID), session: r.session, mode: r.mode, // r's bytes are reused
		step: r.step, epoch: r.epoch, pastLen: r.pastLen,
		tokens: r.tokens, first: r.first,
		bytesIn: r.bytesIn, bytesOut: bodyLen(r), cacheHit: r.cacheHit, prefixRows: r.prefixRows,
	}
	if !o.enqueue(rec) {
		o.dropped.Add(1)
	}
}

// recordEvery is how long the recorder lets finished steps gather before it
// records them. Recording in batches wakes one goroutine per batch instead
// of one per step; a wake-up costs the data plane more than the recording
// itself on a busy small machine.
const recordEvery = 20 * time.Millisecond

// enqueue queues rec without blocking and makes sure the recorder will
// look: the first record after a batch wakes it, a half-full queue hurries
// it. It reports false when the queue is full.
func (o *observer) enqueue(rec stepRecord) bool {
	select {
	case o.records <- rec:
	default:
		return false
	}
	if o.armed.CompareAndSwap(false, true) {
		notify(o.wake)
	}
	if len(o.records) >= cap(o.records)/2 || rec.flushed != nil {
		notify(o.hurry)
	}
	return true
}

// notify sends on a one-slot signal channel unless a signal is pending.
func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// runRecorder records queued steps in batches until stopRecorder.
func (o *observer) runRecorder() {
	defer close(o.recorderDone)
	timer := time.NewTimer(recordEvery)
	timer.Stop()
	for {
		select {
		case <-o.wake:
		case <-o.stopRec:
			o.drain()
			return
		}
		timer.Reset(recordEvery)
		select {
		case <-timer.C:
		case <-o.hurry:
			timer.Stop()
		case <-o.stopRec:
			o.drain()
			return
		}
		// Disarm before draining: a record queued from here on wakes the
		// recorder again, so none is left behind.
		o.armed.Store(false)
		o.drain()
	}
}

// drain records everything queued.
func (o *observer) drain() {
	for {
		select {
		case rec := <-o.records:
			if rec.flushed != nil {
				close(rec.flushed)
				continue
			}
			o.record(&rec)
		default:
			return
		}
	}
}

// record emits one step's stage durations and, when its stream is sampled,
// its spans: a shardd.step span with a child per stage.
func (o *observer) record(rec *stepRecord) {
	tm := &rec.tm
	stages := [...]struct {
		name       string
		start, end time.Time
	}{
		{stageDecode, tm.decodeStart, tm.decodeEnd},
		{stageReassemble, tm.recv.Start, tm.recv.Reassembled},
		{stageDecompress, tm.recv.Reassembled, tm.recv.Decompressed},
		{stageChecksum, tm.recv.Decompressed, tm.recv.Checked},
		{stageQueue, tm.submitted, tm.started},
		{stageForward, tm.started, tm.completed},
		{stageFrameOut, tm.completed, rec.sent},
	}
	ctx := rec.ctx
	for _, s := range stages {
		if !s.start.IsZero() && !s.end.IsZero() {
			o.stage.Record(ctx, s.end.Sub(s.start).Seconds(), o.stageOpt[s.name]...)
		}
	}
	o.bytesOut.Add(ctx, int64(rec.bytesOut))
	if o.tracer == nil || !trace.SpanContextFromContext(ctx).IsSampled() {
		return
	}
	start := tm.decodeStart
	if start.IsZero() {
		start = tm.submitted
	}
	sctx, step := o.tracer.Start(ctx, "shardd.step", trace.WithTimestamp(start), trace.WithAttributes(
		attribute.String("shardd.work_id", rec.workID),
		attribute.String("shardd.route_session", rec.session),
		attribute.Int64("shardd.step", int64(rec.step)),
		attribute.Int64("shardd.epoch", int64(rec.epoch)),
		attribute.Int("shardd.tokens", rec.tokens),
		attribute.Int("shardd.first_position", rec.first),
		attribute.Bool("shardd.cache_hit", rec.cacheHit),
		attribute.Int("shardd.prefix_cached_tokens", rec.prefixRows),
		attribute.Int64("shardd.past_len", int64(rec.pastLen)),
		attribute.String("shardd.mode", rec.mode.String()),
	))
	for _, s := range stages {
		if s.start.IsZero() || s.end.IsZero() {
			continue
		}
		_, sp := o.tracer.Start(sctx, s.name, trace.WithTimestamp(s.start))
		switch s.name {
		case stageForward:
			sp.SetAttributes(attribute.Int("shardd.bytes_out", rec.bytesOut), attribute.Float64("shardd.host.core_gbps", tm.coreGBps))
		case stageFrameOut:
			sp.SetAttributes(attribute.Int("shardd.bytes_out", rec.bytesOut))
		case stageDecode:
			sp.SetAttributes(attribute.Int("shardd.bytes_in", rec.bytesIn))
		}
		sp.End(trace.WithTimestamp(s.end))
	}
	step.End(trace.WithTimestamp(rec.sent))
}

// FlushTelemetry returns once every step replied before the call has been
// recorded (its spans ended and handed to the tracer provider's processor,
// its stage durations in the histograms), or when ctx ends. On a closed
// engine it returns at once: Close records everything queued.
func (e *Engine) FlushTelemetry(ctx context.Context) error {
	o := &e.obs
	if !o.on {
		return nil
	}
	done := make(chan struct{})
	for !o.enqueue(stepRecord{flushed: done}) {
		select {
		case <-time.After(time.Millisecond): // the queue is full: let it drain
		case <-o.recorderDone: // closed engine: everything was recorded
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case <-done:
		return nil
	case <-o.recorderDone:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopRecorder records what is queued and stops the recorder. It runs after
// every stream's send goroutine has returned.
func (o *observer) stopRecorder() {
	if !o.on {
		return
	}
	close(o.stopRec)
	<-o.recorderDone
}

func bodyLen(r *result) int {
	if r.body == nil {
		return 0
	}
	return r.body.Len()
}

// recordRefusal counts a refused unit of work and, when tracing, marks it
// with a span carrying its ErrorCode.
func (st *stream) recordRefusal(s *shardv1.ShardStatus) {
	o := &st.e.obs
	if !o.on || s.GetError() == nil {
		return
	}
	code := s.Error.Code.String()
	o.errs.Add(st.ctx, 1, metric.WithAttributes(attribute.String("code", code)))
	if o.tracer != nil && trace.SpanContextFromContext(st.ctx).IsSampled() {
		_, sp := o.tracer.Start(st.ctx, "shardd.refused", trace.WithAttributes(
			attribute.String("shardd.work_id", s.WorkId), attribute.Int64("shardd.step", int64(s.IdempotencyStep)),
			attribute.String("shardd.error_code", code)))
		sp.SetStatus(codes.Error, s.Error.Detail)
		sp.End()
	}
}

package engine

import (
	"context"
	"math"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

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
}

// observer holds the engine's tracer and instruments. With neither tracing
// nor metrics configured, on is false and nothing is timed or recorded.
type observer struct {
	on       bool
	tracer   trace.Tracer // nil: tracing off
	stage    metric.Float64Histogram
	errs     metric.Int64Counter
	bytesIn  metric.Int64Counter
	bytesOut metric.Int64Counter
	// stageOpt holds each stage's attribute set, made once: recording with
	// a fresh attribute per call would allocate on every step.
	stageOpt map[string][]metric.RecordOption
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
	gauge("shardd.batch.occupancy", "rows in the last forward call", func() float64 { return float64(e.statOccupancy.Load()) })
	gauge("shardd.kv.pressure", "fraction of the KV token budget in use", func() float64 { return math.Float64frombits(e.statPressure.Load()) })
	gauge("shardd.sessions", "route sessions holding KV state", func() float64 { return float64(e.statSessions.Load()) })
	counter := func(name, desc string, f func() int64) {
		m.Int64ObservableCounter(name, metric.WithDescription(desc),
			metric.WithInt64Callback(func(_ context.Context, obs metric.Int64Observer) error {
				obs.Observe(f())
				return nil
			}))
	}
	counter("shardd.evictions", "sessions evicted by budget or TTL", e.statEvictions.Load)
	counter("shardd.preemptions", "prefill iterations stopped for a decode step", e.preemptions.Load)
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

// recordStep emits a finished step's spans and stage durations. It runs on
// the stream's send goroutine, after the result went out.
func (st *stream) recordStep(r *result, sent time.Time) {
	o := &st.e.obs
	if !o.on {
		return
	}
	tm := &r.tm
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
		{stageFrameOut, tm.completed, sent},
	}
	ctx := st.ctx
	if o.stage != nil {
		for _, s := range stages {
			if !s.start.IsZero() && !s.end.IsZero() {
				o.stage.Record(ctx, s.end.Sub(s.start).Seconds(), o.stageOpt[s.name]...)
			}
		}
	}
	if r.body != nil {
		o.bytesOut.Add(ctx, int64(r.body.Len()))
	}
	if o.tracer == nil || !trace.SpanContextFromContext(ctx).IsSampled() {
		return
	}
	start := tm.decodeStart
	if start.IsZero() {
		start = tm.submitted
	}
	sctx, step := o.tracer.Start(ctx, "shardd.step", trace.WithTimestamp(start), trace.WithAttributes(
		attribute.String("shardd.work_id", r.workID),
		attribute.String("shardd.route_session", r.session),
		attribute.Int64("shardd.step", int64(r.step)),
		attribute.Int64("shardd.epoch", int64(r.epoch)),
		attribute.Int("shardd.tokens", r.tokens),
		attribute.Int("shardd.first_position", r.first),
		attribute.Bool("shardd.cache_hit", r.cacheHit),
		attribute.Int64("shardd.past_len", int64(r.pastLen)),
		attribute.String("shardd.mode", r.mode.String()),
	))
	for _, s := range stages {
		if s.start.IsZero() || s.end.IsZero() {
			continue
		}
		_, sp := o.tracer.Start(sctx, s.name, trace.WithTimestamp(s.start))
		if s.name == stageForward || s.name == stageFrameOut {
			sp.SetAttributes(attribute.Int("shardd.bytes_out", bodyLen(r)))
		}
		if s.name == stageDecode {
			sp.SetAttributes(attribute.Int("shardd.bytes_in", r.bytesIn))
		}
		sp.End(trace.WithTimestamp(s.end))
	}
	step.End(trace.WithTimestamp(sent))
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

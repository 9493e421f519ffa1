package engine

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/telemetry"
)

// TestMetricsEndpoint scrapes /metrics after real work and a refusal and
// finds every named series in Prometheus text format.
func TestMetricsEndpoint(t *testing.T) {
	whole, _ := tinyFiles(t)
	tel, err := telemetry.Setup(context.Background(), telemetry.Config{Service: "shardd", Instance: "test", MetricsListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer tel.Shutdown(context.Background())
	meta, _ := gguf.Read(whole)
	be, err := llamacpp.OpenMeta(llamacpp.Config{Path: whole, Threads: 1, MaxSeqs: 3, CtxTokens: 128, MaxBatch: 32}, meta)
	if err != nil {
		t.Fatal(err)
	}
	idle := &countingPoller{}
	w := startWorker(t, be, meta, Config{MeterProvider: tel.Meter, IdlePoll: idle})
	s := w.open(t, "metrics", 1)
	if o := s.prefillTokens(1, 1, 2, 3); o.ack == nil {
		t.Fatal(o.status)
	}
	if o := s.decodeToken(2, 9, 4); code(o) != cMiss {
		t.Fatalf("want a refusal: %v", o.status)
	}
	if err := w.eng.FlushTelemetry(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + tel.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, series := range []string{
		`shardd_stage_duration_seconds_bucket{stage="forward"`,
		`shardd_stage_duration_seconds_count{stage="decode"}`,
		`shardd_stage_duration_seconds_count{stage="queue"}`,
		`shardd_stage_duration_seconds_count{stage="frameout"}`,
		"shardd_queue_depth ",
		"shardd_batch_occupancy ",
		"shardd_kv_pressure ",
		"shardd_sessions ",
		"shardd_results_bytes ",
		"shardd_evictions_total ",
		"shardd_preemptions_total ",
		"shardd_gather_holds_total ",
		"shardd_gather_expired_total ",
		"shardd_gather_held ",
		"shardd_telemetry_dropped_total ",
		"shardd_idle_poll_spun 1.5\n",
		"shardd_received_bytes_total ",
		"shardd_sent_payload_bytes_total ",
		`shardd_errors_total{code="ERROR_CODE_CACHE_MISS"} 1`,
	} {
		if !strings.Contains(text, series) {
			t.Errorf("metrics lack %s", series)
		}
	}
	// A forward ran, so its core was probed just before it.
	if _, v, ok := strings.Cut(text, "\nshardd_host_core_speed "); !ok {
		t.Error("metrics lack shardd_host_core_speed")
	} else if g, err := strconv.ParseFloat(strings.Fields(v)[0], 64); err != nil || g <= 0 {
		t.Errorf("core speed %q (%v) after a forward", strings.Fields(v)[0], err)
	}
	// The idle poller was extended after the forward.
	if n := idle.extends.Load(); n < 1 {
		t.Errorf("%d idle poll extends after a forward", n)
	}
	if t.Failed() {
		t.Logf("scraped:\n%s", text)
	}
}

// countingPoller counts Extends and says it spun 1.5 s.
type countingPoller struct{ extends atomic.Int64 }

func (p *countingPoller) Extend()             { p.extends.Add(1) }
func (p *countingPoller) Spun() time.Duration { return 1500 * time.Millisecond }

// TestRecorderQueueFullDrops: when the recorder cannot keep up, a finished
// step is dropped and counted instead of blocking the send goroutine; what
// was queued is still recorded.
func TestRecorderQueueFullDrops(t *testing.T) {
	e := &Engine{}
	o := &e.obs
	o.on = true
	o.records = make(chan stepRecord, 1)
	st := &stream{e: e, ctx: context.Background()}
	r := newResult(resultFields{workID: "w", session: "s", step: 7})
	st.recordStep(r, time.Now())
	st.recordStep(r, time.Now()) // queue full: dropped, not blocked
	if got := o.dropped.Load(); got != 1 {
		t.Fatalf("dropped %d, want 1", got)
	}
	if rec := <-o.records; rec.workID != "w" || rec.step != 7 {
		t.Fatalf("queued record %+v", rec)
	}
}

// TestFlushTelemetryAfterClose: flushing a closed engine returns instead of
// waiting for a recorder that has stopped.
func TestFlushTelemetryAfterClose(t *testing.T) {
	e := &Engine{}
	e.initObserver(nil, metricnoop.NewMeterProvider())
	e.obs.stopRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.FlushTelemetry(ctx); err != nil {
		t.Fatalf("flush after close: %v", err)
	}
}

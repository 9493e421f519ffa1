package route

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/engine"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
)

// notifyingRecorder signals every finished span.
type notifyingRecorder struct {
	*tracetest.SpanRecorder
	ended chan struct{}
}

func (n notifyingRecorder) OnEnd(s sdktrace.ReadOnlySpan) {
	n.SpanRecorder.OnEnd(s)
	select {
	case n.ended <- struct{}{}:
	default:
	}
}

// provider records into rec, naming this process instance.
func provider(rec sdktrace.SpanProcessor, instance string) *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(
		resource.NewSchemaless(attribute.String("service.instance.id", instance))))
}

// TestGenerationSpanTree: one generation through two shards is one trace:
// generate -> client stream -> server stream -> step -> every stage, on both
// hops, with the step attributes set.
func TestGenerationSpanTree(t *testing.T) {
	_, shards := tinyShards(t, 2)
	rec := notifyingRecorder{tracetest.NewSpanRecorder(), make(chan struct{}, 1)}
	var addrs []string
	var engines []*engine.Engine
	for i, s := range shards {
		meta, _ := gguf.Read(s)
		be, err := llamacpp.OpenMeta(llamacpp.Config{Path: s, Threads: 1, MaxSeqs: 3, CtxTokens: 128, MaxBatch: 32}, meta)
		if err != nil {
			t.Fatal(err)
		}
		tp := provider(rec, []string{"hop-a", "hop-b"}[i])
		eng := engine.New(engine.Config{TracerProvider: tp}, be, meta, slog.New(slog.NewTextHandler(io.Discard, nil)))
		engines = append(engines, eng)
		lis, _ := net.Listen("tcp", "127.0.0.1:0")
		srv := grpc.NewServer(eng.ServerOptions()...)
		shardv1.RegisterShardRuntimeServer(srv, eng)
		go srv.Serve(lis)
		t.Cleanup(func() { srv.Stop(); eng.Close(); be.Close(); tp.Shutdown(context.Background()) })
		addrs = append(addrs, lis.Addr().String())
	}
	head := provider(rec, "head")
	defer head.Shutdown(context.Background())
	r, err := Dial(context.Background(), addrs, Options{TracerProvider: head})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const n = 3
	prompt := []int32{1, 2, 3}
	if _, err := r.Generate(context.Background(), Request{Prompt: prompt, MaxTokens: n}, func(int32) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// Workers make step spans in batches after replying: wait for them.
	for _, eng := range engines {
		if err := eng.FlushTelemetry(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Server stream spans end when the handlers return, just after Generate.
	timeout := time.After(10 * time.Second)
	for countKind(rec.Ended(), trace.SpanKindServer) < 2 {
		select {
		case <-rec.ended:
		case <-timeout:
			t.Fatal("server stream spans did not end")
		}
	}
	spans := rec.Ended()
	byID := map[trace.SpanID]sdktrace.ReadOnlySpan{}
	var root sdktrace.ReadOnlySpan
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
		if s.Name() == "shardd.generate" {
			root = s
		}
	}
	if root == nil || root.Parent().IsValid() {
		t.Fatalf("no root generate span among %d spans", len(spans))
	}
	steps := map[string]int{}
	cores := map[string]float64{}
	for _, s := range spans {
		if s.Name() != "shardd.step" {
			continue // Dial's capability calls are traces of their own
		}
		if s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Fatalf("a step span is in another trace than its generation")
		}
		server := byID[s.Parent().SpanID()]
		client := byID[server.Parent().SpanID()]
		if server == nil || server.SpanKind() != trace.SpanKindServer || client == nil ||
			client.SpanKind() != trace.SpanKindClient || client.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Fatalf("step span not under server <- client <- generate")
		}
		hop := instance(s)
		steps[hop]++
		attrs := map[attribute.Key]bool{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = true
		}
		for _, k := range []attribute.Key{"shardd.work_id", "shardd.route_session", "shardd.step", "shardd.tokens", "shardd.cache_hit"} {
			if !attrs[k] {
				t.Fatalf("step span on %s lacks %s", hop, k)
			}
		}
		var children []string
		for _, c := range spans {
			if c.Parent().SpanID() == s.SpanContext().SpanID() {
				children = append(children, c.Name())
			}
		}
		for _, stage := range []string{"decode", "reassemble", "decompress", "checksum", "queue", "forward", "frameout"} {
			if !slices.Contains(children, stage) {
				t.Fatalf("step on %s lacks stage %s (has %v)", hop, stage, children)
			}
		}
		// The forward says how fast its core ran (probed before it; 0
		// only where the probe failed).
		for _, c := range spans {
			if c.Parent().SpanID() != s.SpanContext().SpanID() || c.Name() != "forward" {
				continue
			}
			core := -1.0
			for _, kv := range c.Attributes() {
				if kv.Key == "shardd.host.core_gbps" {
					core = kv.Value.AsFloat64()
				}
			}
			if core < 0 {
				t.Fatalf("forward on %s: no core speed", hop)
			}
			cores[hop] = max(cores[hop], core)
		}
	}
	for _, hop := range []string{"hop-a", "hop-b"} {
		if cores[hop] <= 0 {
			t.Errorf("no forward on %s says how fast its core ran", hop)
		}
	}
	// One prefill chunk and n-1 decode steps on each hop.
	if want := 1 + n - 1; steps["hop-a"] != want || steps["hop-b"] != want {
		t.Fatalf("steps per hop %v, want %d each", steps, want)
	}
}

func countKind(spans []sdktrace.ReadOnlySpan, k trace.SpanKind) int {
	n := 0
	for _, s := range spans {
		if s.SpanKind() == k {
			n++
		}
	}
	return n
}

func instance(s sdktrace.ReadOnlySpan) string {
	for _, kv := range s.Resource().Attributes() {
		if kv.Key == "service.instance.id" {
			return kv.Value.AsString()
		}
	}
	return ""
}

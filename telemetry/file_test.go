package telemetry

import (
	"context"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// TestFileRoundTrip: spans written by the file exporter read back with
// their parents, instance and attributes (quotes, control characters and
// invalid UTF-8 included).
func TestFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "spans.jsonl")
	exp, err := NewFileExporter(path)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.instance.id", "hop-1"))))
	ctx, parent := tp.Tracer("t").Start(context.Background(), "shardd.step")
	_, child := tp.Tracer("t").Start(ctx, "forward")
	child.SetAttributes(attribute.String("note", `a "quoted" value`), attribute.Int("n", 3),
		attribute.String("odd", "tab\t bell\a back\\slash é \xff"), attribute.Bool("hit", true))
	child.End()
	parent.End()
	tp.Shutdown(context.Background())
	spans, err := ReadSpans(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) != 2 {
		t.Fatalf("%d spans", len(spans))
	}
	c, p := spans[0], spans[1]
	if c.Name != "forward" || p.Name != "shardd.step" || c.Parent != p.SpanID || c.TraceID != p.TraceID || p.Parent != "" {
		t.Fatalf("tree: %+v %+v", c, p)
	}
	if c.Instance != "hop-1" || c.Attrs["note"] != `a "quoted" value` || c.Attrs["n"] != "3" || c.Attrs["hit"] != "true" ||
		c.Attrs["odd"] != "tab\t bell\a back\\slash é \uFFFD" || c.End < c.Start {
		t.Fatalf("fields: %+v", c)
	}
}

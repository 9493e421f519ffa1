package telemetry

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"sync"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// SpanRecord is one span in the JSON-lines file.
type SpanRecord struct {
	TraceID  string            `json:"trace_id"`
	SpanID   string            `json:"span_id"`
	Parent   string            `json:"parent_span_id,omitempty"`
	Name     string            `json:"name"`
	Service  string            `json:"service,omitempty"`
	Instance string            `json:"instance,omitempty"`
	Start    int64             `json:"start_unix_nano"`
	End      int64             `json:"end_unix_nano"`
	Attrs    map[string]string `json:"attributes,omitempty"`
}

// FileExporter writes finished spans as JSON lines, for offline debugging
// with `shardd trace-report`.
type FileExporter struct {
	mu sync.Mutex // guards w
	f  *os.File
	w  *bufio.Writer
}

// NewFileExporter appends to path.
func NewFileExporter(path string) (*FileExporter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &FileExporter{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

// ExportSpans writes spans and flushes.
func (e *FileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	enc := json.NewEncoder(e.w)
	for _, s := range spans {
		r := SpanRecord{
			TraceID: s.SpanContext().TraceID().String(), SpanID: s.SpanContext().SpanID().String(),
			Name: s.Name(), Start: s.StartTime().UnixNano(), End: s.EndTime().UnixNano(),
		}
		if p := s.Parent(); p.IsValid() {
			r.Parent = p.SpanID().String()
		}
		for _, kv := range s.Resource().Attributes() {
			switch kv.Key {
			case "service.name":
				r.Service = kv.Value.Emit()
			case "service.instance.id":
				r.Instance = kv.Value.Emit()
			}
		}
		if attrs := s.Attributes(); len(attrs) > 0 {
			r.Attrs = make(map[string]string, len(attrs))
			for _, kv := range attrs {
				r.Attrs[string(kv.Key)] = kv.Value.Emit()
			}
		}
		if err := enc.Encode(&r); err != nil {
			return err
		}
	}
	return e.w.Flush()
}

// Shutdown flushes and closes the file.
func (e *FileExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.f == nil {
		return nil
	}
	err := e.w.Flush()
	if cerr := e.f.Close(); err == nil {
		err = cerr
	}
	e.f = nil
	return err
}

package telemetry

import (
	"bufio"
	"context"
	"os"
	"strconv"
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
	mu  sync.Mutex // guards f, w and buf
	f   *os.File
	w   *bufio.Writer
	buf []byte
}

// NewFileExporter appends to path.
func NewFileExporter(path string) (*FileExporter, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &FileExporter{f: f, w: bufio.NewWriterSize(f, 64<<10)}, nil
}

// ExportSpans writes spans and flushes. The encoder appends into one reused
// buffer: an exporter that allocates per span competes for the cores the
// worker needs.
func (e *FileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range spans {
		b := e.buf[:0]
		b = append(b, `{"trace_id":"`...)
		b = append(b, s.SpanContext().TraceID().String()...)
		b = append(b, `","span_id":"`...)
		b = append(b, s.SpanContext().SpanID().String()...)
		b = append(b, '"')
		if p := s.Parent(); p.IsValid() {
			b = append(b, `,"parent_span_id":"`...)
			b = append(b, p.SpanID().String()...)
			b = append(b, '"')
		}
		b = append(b, `,"name":`...)
		b = strconv.AppendQuote(b, s.Name())
		for _, kv := range s.Resource().Attributes() {
			switch kv.Key {
			case "service.name":
				b = append(b, `,"service":`...)
				b = strconv.AppendQuote(b, kv.Value.Emit())
			case "service.instance.id":
				b = append(b, `,"instance":`...)
				b = strconv.AppendQuote(b, kv.Value.Emit())
			}
		}
		b = append(b, `,"start_unix_nano":`...)
		b = strconv.AppendInt(b, s.StartTime().UnixNano(), 10)
		b = append(b, `,"end_unix_nano":`...)
		b = strconv.AppendInt(b, s.EndTime().UnixNano(), 10)
		if attrs := s.Attributes(); len(attrs) > 0 {
			b = append(b, `,"attributes":{`...)
			for i, kv := range attrs {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendQuote(b, string(kv.Key))
				b = append(b, ':')
				b = strconv.AppendQuote(b, kv.Value.Emit())
			}
			b = append(b, '}')
		}
		b = append(b, "}\n"...)
		e.buf = b
		if _, err := e.w.Write(b); err != nil {
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

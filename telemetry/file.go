package telemetry

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"strconv"
	"sync"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
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
	mu  sync.Mutex // guards everything below
	f   *os.File
	w   *bufio.Writer
	buf []byte

	res       *resource.Resource // the resource resFields encodes
	resFields []byte
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
// buffer and allocates nothing per span: an exporter that allocates competes
// for the cores the worker needs (see PERF.md, tracing).
func (e *FileExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.buf[:0]
	for _, s := range spans {
		sc := s.SpanContext()
		tid, sid := sc.TraceID(), sc.SpanID()
		b = append(b, `{"trace_id":"`...)
		b = hex.AppendEncode(b, tid[:])
		b = append(b, `","span_id":"`...)
		b = hex.AppendEncode(b, sid[:])
		b = append(b, '"')
		if p := s.Parent(); p.IsValid() {
			pid := p.SpanID()
			b = append(b, `,"parent_span_id":"`...)
			b = hex.AppendEncode(b, pid[:])
			b = append(b, '"')
		}
		b = append(b, `,"name":`...)
		b = appendJSONString(b, s.Name())
		b = append(b, e.resourceFields(s.Resource())...)
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
				b = appendJSONString(b, string(kv.Key))
				b = append(b, ':')
				b = appendValue(b, kv.Value)
			}
			b = append(b, '}')
		}
		b = append(b, "}\n"...)
		if len(b) >= 32<<10 {
			if _, err := e.w.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	e.buf = b[:0]
	if _, err := e.w.Write(b); err != nil {
		return err
	}
	return e.w.Flush()
}

// resourceFields returns the encoded service and instance fields of res.
// Every span of a provider shares one resource, so the encoding is made
// once: reading a resource's attributes copies them.
func (e *FileExporter) resourceFields(res *resource.Resource) []byte {
	if res == e.res && e.res != nil {
		return e.resFields
	}
	var b []byte
	for _, kv := range res.Attributes() {
		switch kv.Key {
		case "service.name":
			b = append(b, `,"service":`...)
			b = appendJSONString(b, kv.Value.Emit())
		case "service.instance.id":
			b = append(b, `,"instance":`...)
			b = appendJSONString(b, kv.Value.Emit())
		}
	}
	e.res, e.resFields = res, b
	return b
}

// appendValue appends an attribute value as a JSON string (the file keeps
// every attribute as text; see SpanRecord).
func appendValue(b []byte, v attribute.Value) []byte {
	switch v.Type() {
	case attribute.STRING:
		return appendJSONString(b, v.AsString())
	case attribute.INT64:
		b = append(b, '"')
		b = strconv.AppendInt(b, v.AsInt64(), 10)
		return append(b, '"')
	case attribute.BOOL:
		b = append(b, '"')
		b = strconv.AppendBool(b, v.AsBool())
		return append(b, '"')
	default:
		return appendJSONString(b, v.Emit())
	}
}

// appendJSONString appends s as a JSON string. Valid UTF-8 passes through;
// quotes, backslashes and control characters are escaped and invalid bytes
// become U+FFFD, so any attribute a caller sets still reads back.
func appendJSONString(b []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\t':
				b = append(b, '\\', 't')
			case '\r':
				b = append(b, '\\', 'r')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
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

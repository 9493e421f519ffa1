// Package telemetry sets up shardd's OpenTelemetry tracing and metrics.
//
// Tracing is off unless asked for; then every unit of work gets a span per
// stage (see package engine) exported over OTLP (gRPC or HTTP; the standard
// OTEL_EXPORTER_OTLP_* variables apply) or to a JSON-lines file that `shardd
// trace-report` reads. Metrics go through the OpenTelemetry metrics API to a
// Prometheus exporter served at /metrics on its own listener.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Config selects exporters.
type Config struct {
	// Traces: "" or "none" (off), "otlp-grpc", "otlp-http", or "file:PATH"
	// (JSON lines).
	Traces string
	// SampleRatio of traces recorded when tracing is on (parent-based:
	// a sampled parent from upstream is always followed). 0 means 1.
	SampleRatio float64
	// Service and Instance name this process in every span: the instance
	// (typically the listen address) is what trace-report calls a hop.
	Service, Instance string
	// MetricsListen serves Prometheus /metrics there; "" turns metrics off.
	MetricsListen string
	// Profiling also serves Go's profiles (net/http/pprof) at
	// /debug/pprof/ on the metrics listener. Off by default: a CPU or
	// trace profile costs the process while it runs, and the listener is
	// plain HTTP with no authentication.
	Profiling bool
}

// Telemetry holds the providers; Shutdown flushes and stops them.
type Telemetry struct {
	Tracer      trace.TracerProvider
	Meter       metric.MeterProvider
	MetricsAddr string // the bound address when metrics are served
	Tracing     bool

	shutdown []func(context.Context) error
}

// Setup builds the providers.
func Setup(ctx context.Context, cfg Config) (*Telemetry, error) {
	t := &Telemetry{Tracer: noop.NewTracerProvider()}
	res := resource.NewSchemaless(
		attribute.String("service.name", cfg.Service),
		attribute.String("service.instance.id", cfg.Instance),
	)
	if cfg.Profiling && cfg.MetricsListen == "" {
		return nil, fmt.Errorf("telemetry: profiles are served on the metrics listener: set one")
	}
	if err := t.setupTraces(ctx, cfg, res); err != nil {
		return nil, err
	}
	if cfg.MetricsListen != "" {
		if err := t.setupMetrics(cfg, res); err != nil {
			t.Shutdown(ctx)
			return nil, err
		}
	}
	return t, nil
}

func (t *Telemetry) setupTraces(ctx context.Context, cfg Config, res *resource.Resource) error {
	var exp sdktrace.SpanExporter
	var err error
	switch mode := cfg.Traces; {
	case mode == "" || mode == "none":
		return nil
	case mode == "otlp-grpc":
		exp, err = otlptracegrpc.New(ctx)
	case mode == "otlp-http":
		exp, err = otlptracehttp.New(ctx)
	case strings.HasPrefix(mode, "file:"):
		exp, err = NewFileExporter(strings.TrimPrefix(mode, "file:"))
	default:
		return fmt.Errorf("telemetry: unknown trace exporter %q (none, otlp-grpc, otlp-http, file:PATH)", mode)
	}
	if err != nil {
		return fmt.Errorf("telemetry: trace exporter: %w", err)
	}
	ratio := cfg.SampleRatio
	if ratio <= 0 {
		ratio = 1
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))),
	)
	t.Tracer, t.Tracing = tp, true
	t.shutdown = append(t.shutdown, tp.Shutdown)
	return nil
}

func (t *Telemetry) setupMetrics(cfg Config, res *resource.Resource) error {
	reg := prometheus.NewRegistry()
	// The Go runtime's and the process's own figures (go_goroutines,
	// process_resident_memory_bytes, ...): what a soak or an operator
	// watches for leaks.
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo())
	if err != nil {
		return fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithResource(res))
	t.Meter = mp
	t.shutdown = append(t.shutdown, mp.Shutdown)
	lis, err := net.Listen("tcp", cfg.MetricsListen)
	if err != nil {
		return fmt.Errorf("telemetry: metrics listener: %w", err)
	}
	t.MetricsAddr = lis.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	if cfg.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index) // and each named profile under it
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(lis)
	t.shutdown = append(t.shutdown, srv.Shutdown)
	return nil
}

// TracerProvider is the provider to instrument with, or nil when tracing is
// off (so instrumented code skips its work entirely).
func (t *Telemetry) TracerProvider() trace.TracerProvider {
	if !t.Tracing {
		return nil
	}
	return t.Tracer
}

// Shutdown flushes exporters and stops the metrics server.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	t.shutdown = nil
	return errors.Join(errs...)
}

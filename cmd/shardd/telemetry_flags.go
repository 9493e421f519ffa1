package main

import (
	"context"
	"flag"

	"github.com/meshnet/shardd/telemetry"
)

type telemetryFlags struct {
	traces, metrics, instance *string
	sample                    *float64
	pprof                     *bool
}

func addTelemetryFlags(fs *flag.FlagSet) *telemetryFlags {
	return &telemetryFlags{
		traces:   fs.String("traces", "none", "span exporter: none, otlp-grpc, otlp-http (OTEL_EXPORTER_OTLP_* apply) or file:PATH (JSON lines for trace-report)"),
		sample:   fs.Float64("trace-sample", 1, "fraction of new traces recorded (a sampled parent is always followed)"),
		metrics:  fs.String("metrics-listen", "", "serve Prometheus /metrics on this address (empty: no metrics)"),
		instance: fs.String("instance", "", "this process's name in spans (default: the listen address)"),
		pprof:    fs.Bool("pprof", false, "also serve Go's profiles at /debug/pprof/ on --metrics-listen (go tool pprof http://ADDR/debug/pprof/profile; time in llama.cpp shows as its cgo call; plain HTTP, no authentication: keep it on loopback or a private network)"),
	}
}

func (f *telemetryFlags) setup(defaultInstance string) (*telemetry.Telemetry, error) {
	inst := *f.instance
	if inst == "" {
		inst = defaultInstance
	}
	return telemetry.Setup(context.Background(), telemetry.Config{
		Traces: *f.traces, SampleRatio: *f.sample, Service: "shardd", Instance: inst, MetricsListen: *f.metrics,
		Profiling: *f.pprof,
	})
}

package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the front door's own figures, served at /metrics beside the
// Go runtime's and the process's.
type metrics struct {
	reg                            *prometheus.Registry
	requests                       *prometheus.CounterVec
	inflight, queued               prometheus.Gauge
	ttft, itl                      prometheus.Histogram
	promptTokens, completionTokens prometheus.Counter
}

// latencyBuckets span 1 ms to about 65 s.
var latencyBuckets = prometheus.ExponentialBuckets(0.001, 2, 17)

func newMetrics(reg *prometheus.Registry, cfg Config) *metrics {
	m := &metrics{reg: reg,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardd_api_requests_total",
			Help: "HTTP requests by endpoint and status (499: the client left before the answer)."}, []string{"endpoint", "status"}),
		inflight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardd_api_requests_inflight", Help: "Generations running."}),
		queued:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "shardd_api_requests_queued", Help: "Requests waiting for a generation slot."}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardd_api_ttft_seconds",
			Help: "Time from a request's arrival to its first generated token.", Buckets: latencyBuckets}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "shardd_api_itl_seconds",
			Help: "Time between consecutive generated tokens of a request.", Buckets: latencyBuckets}),
		promptTokens:     prometheus.NewCounter(prometheus.CounterOpts{Name: "shardd_api_prompt_tokens_total", Help: "Prompt tokens of admitted requests."}),
		completionTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardd_api_completion_tokens_total", Help: "Tokens generated."}),
	}
	limit := func(name, help string, v int) prometheus.Collector {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		g.Set(float64(v))
		return g
	}
	reg.MustRegister(m.requests, m.inflight, m.queued, m.ttft, m.itl, m.promptTokens, m.completionTokens,
		limit("shardd_api_max_inflight", "Limit: generations running at once.", cfg.MaxInflight),
		limit("shardd_api_max_queue", "Limit: requests waiting behind them; past it, 429.", cfg.MaxQueue),
		limit("shardd_api_max_tokens", "Limit: max_tokens of a request.", cfg.MaxTokens),
		limit("shardd_api_max_body_bytes", "Limit: a request body's size.", int(cfg.MaxBodyBytes)),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// request counts a finished request.
func (m *metrics) request(endpoint string, status int) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(status)).Inc()
}

// endpointOf names a request's endpoint for the metrics (a bounded set).
func endpointOf(r *http.Request) string {
	switch p := r.URL.Path; {
	case p == "/v1/completions":
		return "completions"
	case p == "/v1/chat/completions":
		return "chat_completions"
	case strings.HasPrefix(p, "/v1/models"):
		return "models"
	}
	return "other"
}

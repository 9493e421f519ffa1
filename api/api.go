// Package api is shardd's front door: an OpenAI-compatible HTTP API over
// one route. A Server holds the route (one route.Route, its connections
// shared by every request), the model's tokenizer, and the bounds a
// public endpoint needs: requests in flight, a queue behind them, a
// deadline per request, body and header sizes, and optional API keys.
//
// A request is parsed strictly (an unknown field, or one this server
// cannot honour, is a 400 naming it), rendered to token ids (chat messages
// through the model's own template), admitted (or queued, or refused with
// 429), and generated through route.Generate under the request's context:
// a client that goes away cancels its generation, and the route releases
// the session on every worker. Pieces become text through textOut, which
// sends only whole UTF-8 characters and never any part of a stop string;
// streamed answers are Server-Sent Events in the OpenAI chunk format.
package api

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meshnet/shardd/internal/chat"
	"github.com/meshnet/shardd/route"
)

// Generator runs generations: a route.Route.
type Generator interface {
	Generate(ctx context.Context, req route.Request, emit func(tok int32) error) (route.Stats, error)
}

// Vocab is the model's tokenizer (llamacpp.Tokenizer).
type Vocab interface {
	chat.Vocab
	Encode(text string) ([]int32, error)
}

// Config is a Server's settings. Zero values take the defaults noted.
type Config struct {
	// Model is the id /v1/models lists and responses carry.
	Model string
	// Vocabulary is the route's vocabulary size: prompt token ids must be
	// below it.
	Vocabulary int
	// ChatTemplate overrides the model's own (a llama.cpp template name).
	ChatTemplate string
	// MaxInflight bounds generations running at once (default 64);
	// MaxQueue bounds those waiting behind them (default 256). Past the
	// queue a request gets 429 with Retry-After.
	MaxInflight, MaxQueue int
	// MaxTokens bounds max_tokens, and is a chat request's default when it
	// gives none (default 2048). A completion without max_tokens gets 16,
	// as OpenAI's API does.
	MaxTokens int
	// RequestTimeout is a request's deadline, queueing included: the
	// route's deadline for its generation (0: none).
	RequestTimeout time.Duration
	// MaxBodyBytes bounds a request body (default 4 MiB).
	MaxBodyBytes int64
	// Keys, when non-empty, are the bearer API keys accepted; any other
	// (or none) is 401.
	Keys []string
	// Health reports whether every hop serves (nil: always healthy).
	Health func(ctx context.Context) error
	// Registry receives the front door's metrics (nil: a new one, served
	// at /metrics).
	Registry *prometheus.Registry
}

// Server is the HTTP API. It is safe for concurrent use.
type Server struct {
	cfg   Config
	gen   Generator
	vocab Vocab
	// tokMu serializes tokenizing and rendering: cheap next to a
	// generation, and llama.cpp does not promise them thread-safe.
	tokMu sync.Mutex
	// places holds one token per admitted request, running or waiting
	// (MaxInflight + MaxQueue); slots one per generation running. A
	// request takes its place first and keeps it until its slot is
	// freed, so a waiting request that moves into a slot never makes
	// the server look full for a moment.
	places  chan struct{}
	slots   chan struct{}
	m       *metrics
	handler http.Handler
}

// New returns a Server generating with gen and tokenizing with vocab.
func New(cfg Config, gen Generator, vocab Vocab) *Server {
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 64
	}
	if cfg.MaxQueue < 0 {
		cfg.MaxQueue = 0
	} else if cfg.MaxQueue == 0 {
		cfg.MaxQueue = 256
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = 2048
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 4 << 20
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, gen: gen, vocab: vocab,
		places: make(chan struct{}, cfg.MaxInflight+cfg.MaxQueue), slots: make(chan struct{}, cfg.MaxInflight)}
	s.m = newMetrics(cfg.Registry, cfg)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /v1/models/{id}", s.models)
	mux.HandleFunc("GET /health", s.health)
	mux.Handle("GET /metrics", s.m.handler())
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) })
	s.handler = s.authorize(mux)
	return s
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// authorize refuses requests without an accepted bearer key (when keys
// are set). /health and /metrics are open: probes and scrapers carry no
// key, and they reveal no model output.
func (s *Server) authorize(next http.Handler) http.Handler {
	if len(s.cfg.Keys) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || r.URL.Path == "/metrics" {
			next.ServeHTTP(w, r)
			return
		}
		auth := r.Header.Get("Authorization")
		const prefix = "Bearer "
		ok := false
		if len(auth) > len(prefix) && auth[:len(prefix)] == prefix {
			got := []byte(auth[len(prefix):])
			for _, k := range s.cfg.Keys {
				// Every key compared, in constant time each.
				if subtle.ConstantTimeCompare(got, []byte(k)) == 1 {
					ok = true
				}
			}
		}
		if !ok {
			s.m.request(endpointOf(r), http.StatusUnauthorized)
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "",
				"missing or invalid API key: send Authorization: Bearer KEY")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// models lists the one model served.
func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	card := map[string]any{"id": s.cfg.Model, "object": "model", "created": 0, "owned_by": "shardd",
		"meta": map[string]any{"n_vocab": s.cfg.Vocabulary}} // as llama-server reports it
	if id := r.PathValue("id"); id != "" {
		if id != s.cfg.Model {
			s.m.request("models", http.StatusNotFound)
			writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
				"the model '"+clip(id)+"' does not exist; this server serves '"+s.cfg.Model+"'")
			return
		}
		s.m.request("models", http.StatusOK)
		writeJSON(w, http.StatusOK, card)
		return
	}
	s.m.request("models", http.StatusOK)
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{card}})
}

// health is 200 when every hop answers SERVING, else 503 with the reason.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Health != nil {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := s.cfg.Health(ctx); err != nil {
			s.m.request("health", http.StatusServiceUnavailable)
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "unavailable", "reason": sanitize(err)})
			return
		}
	}
	s.m.request("health", http.StatusOK)
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
}

// admit takes a generation slot, waiting in the queue when all are taken.
// It returns the release, or false when the queue is full (the caller
// answers 429) or the request ended while it waited (err set).
func (s *Server) admit(ctx context.Context) (release func(), full bool, err error) {
	select {
	case s.places <- struct{}{}:
	default:
		return nil, true, nil
	}
	select {
	case s.slots <- struct{}{}:
		s.m.inflight.Inc()
		return s.release, false, nil
	default:
	}
	s.m.queued.Inc()
	defer s.m.queued.Dec()
	select {
	case s.slots <- struct{}{}:
		s.m.inflight.Inc()
		return s.release, false, nil
	case <-ctx.Done():
		<-s.places
		return nil, false, ctx.Err()
	}
}

func (s *Server) release() {
	s.m.inflight.Dec()
	<-s.slots
	<-s.places
}

// newID is a response id: the prefix and 24 random hex digits.
func newID(prefix string) string {
	var b [12]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// errStopString ends a generation whose text reached a stop string;
// errClientGone one whose client can no longer be written to.
var (
	errStopString = errors.New("api: stop string")
	errClientGone = errors.New("api: the client is gone")
)

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/meshnet/shardd/api"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/route"
)

func init() {
	register(command{name: "api", summary: "serve an OpenAI-compatible HTTP API as the head of a route", run: runAPI})
}

type apiFlags struct {
	route, listen, tokenizer, modelID, chatTemplate, keys *string
	maxInflight, maxQueue, maxTokens, chunk, pipeChunks   *int
	maxBody                                               *int64
	requestTimeout, stepTimeout                           *time.Duration
	compact                                               *bool
	tls, workerTLS                                        *tlsFlags
	tel                                                   *telemetryFlags
}

func parseAPI(args []string) (*apiFlags, error) {
	fs := newFlags("api", "--route ADDR1,ADDR2[,...] --tokenizer FIRST_SHARD.gguf [--listen HOST:PORT] [flags]",
		"Serves the OpenAI HTTP API (/v1/models, /v1/completions, /v1/chat/completions with streaming,\n"+
			"/health, /metrics) as the head of one route: every request is a generation through the\n"+
			"route's workers, which share one connection each. README: Serving the OpenAI API.")
	f := &apiFlags{}
	f.route = fs.String("route", "", routeHelp)
	f.listen = fs.String("listen", "127.0.0.1:8080", "HTTP listen address")
	f.tokenizer = fs.String("tokenizer", "", "GGUF whose vocabulary tokenizes prompts and renders chats: the route's first shard (a vocab-only load) or the whole model")
	f.modelID = fs.String("model-id", "", "the model's id in /v1/models and responses (default: the GGUF's general.name)")
	f.chatTemplate = fs.String("chat-template", "", "one of llama.cpp's built-in chat templates (chatml, gemma, ...) instead of the model's own")
	f.maxInflight = fs.Int("max-inflight", 64, "generations running at once")
	f.maxQueue = fs.Int("max-queue", 256, "requests waiting behind them; past it the answer is 429 with Retry-After (-1: no queue)")
	f.maxTokens = fs.Int("max-tokens", 2048, "the most max_tokens a request may ask, and a chat request's default")
	f.requestTimeout = fs.Duration("request-timeout", 10*time.Minute, "a request's deadline, queueing included; the route's deadline for its generation (0: none)")
	f.maxBody = fs.Int64("max-body-bytes", 4<<20, "the largest request body (413 past it); headers are bounded to 64 KiB")
	f.keys = fs.String("api-keys", "", "file of accepted bearer API keys, one a line (# comments); without it no key is asked")
	f.compact = fs.Bool("compact-logits", true, "ask the last hop for the best K logits only where sampling needs no more (greedy, top-k): the same tokens, far fewer bytes")
	f.stepTimeout = fs.Duration("step-timeout", 60*time.Second, "deadline of one step on one worker")
	f.chunk = fs.Int("prefill-chunk", 0, "tokens per prefill chunk (0: what the workers grant)")
	f.pipeChunks = fs.Int("pipeline-chunks", 0, pipelineChunksHelp)
	f.tls = addServerTLS(fs)
	f.workerTLS = addClientTLSNamed(fs, "worker-")
	f.tel = addTelemetryFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := required(fs, "route", "tokenizer"); err != nil {
		return nil, err
	}
	return f, nil
}

func runAPI(args []string) error {
	f, err := parseAPI(args)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	keys, err := readKeys(*f.keys)
	if err != nil {
		return err
	}
	tok, err := llamacpp.OpenTokenizer(*f.tokenizer)
	if err != nil {
		return err
	}
	defer tok.Close()
	id := *f.modelID
	if id == "" {
		meta, _ := gguf.Read(*f.tokenizer)
		if id = strings.TrimSpace(meta.Name); id == "" {
			id = strings.TrimSuffix(filepath.Base(*f.tokenizer), ".gguf")
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tel, err := f.tel.setup("api")
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	if tel.MetricsAddr != "" {
		fmt.Printf("shardd api: metrics on %s\n", tel.MetricsAddr) // --metrics-listen may pick a free port
	}
	hops, alts, workerTLS, err := routeSpec(*f.route, f.workerTLS)
	if err != nil {
		return err
	}
	r, err := route.Dial(ctx, hops, route.Options{StepTimeout: *f.stepTimeout, PrefillChunk: *f.chunk, PipelineChunks: *f.pipeChunks,
		TracerProvider: tel.TracerProvider(), TLS: workerTLS, CompactLogits: *f.compact, Alternates: alts})
	if err != nil {
		return err
	}
	defer r.Close()
	vocab, err := routeVocab(ctx, r)
	if err != nil {
		return err
	}
	if n := tok.VocabSize(); n != vocab {
		return fmt.Errorf("--tokenizer %s has %d tokens but the route's last hop returns %d logits: not this route's model", filepath.Base(*f.tokenizer), n, vocab)
	}
	srv := api.New(api.Config{Model: id, Vocabulary: vocab, ChatTemplate: *f.chatTemplate,
		MaxInflight: *f.maxInflight, MaxQueue: *f.maxQueue, MaxTokens: *f.maxTokens, RequestTimeout: *f.requestTimeout,
		MaxBodyBytes: *f.maxBody, Keys: keys, Health: r.Health}, r, tok)
	return serveHTTP(ctx, log, f, srv, id, len(hops))
}

// serveHTTP serves srv on --listen (TLS with the server flags) until ctx
// ends, then lets the requests in flight finish for up to 30 s.
func serveHTTP(ctx context.Context, log *slog.Logger, f *apiFlags, srv http.Handler, id string, hops int) error {
	tlsCfg, err := f.tls.config([]string{*f.listen}, log)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *f.listen)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv, MaxHeaderBytes: 64 << 10, ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	if tlsCfg != nil {
		hs.TLSConfig = httpTLS(tlsCfg)
		lis = tls.NewListener(lis, hs.TLSConfig)
	}
	fmt.Printf("shardd api: listening on http%s://%s (model %q, a route of %d hops)\n", map[bool]string{true: "s"}[tlsCfg != nil], lis.Addr(), id, hops)
	done := make(chan error, 1)
	go func() { done <- hs.Serve(lis) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	log.Info("api: shutting down; requests in flight may finish", "grace", "30s")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

// httpTLS is the server's TLS configuration for HTTP: the same
// certificates and client CA as serve's, offering HTTP/2 and HTTP/1.1.
func httpTLS(c *tls.Config) *tls.Config {
	out := c.Clone()
	get := c.GetConfigForClient
	out.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		cc, err := get(hello)
		if err != nil || cc == nil {
			return cc, err
		}
		cc = cc.Clone()
		cc.NextProtos = []string{"h2", "http/1.1"}
		return cc, nil
	}
	return out
}

// routeVocab runs one token through the route, which proves it generates,
// and returns the width of its logits: the vocabulary.
func routeVocab(ctx context.Context, r *route.Route) (int, error) {
	st, err := r.Generate(ctx, route.Request{Prompt: []int32{1}, MaxTokens: 1, Logits: func(int, []float32) {}},
		func(int32) error { return nil })
	if err != nil {
		return 0, fmt.Errorf("api: the route's first generation failed: %w", err)
	}
	return st.Vocab, nil
}

// readKeys reads a file of API keys, one a line; "" is no file, no keys.
func readKeys(path string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	fh, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var keys []string
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if k := strings.TrimSpace(sc.Text()); k != "" && !strings.HasPrefix(k, "#") {
			keys = append(keys, k)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("--api-keys %s holds no key", path)
	}
	return keys, nil
}

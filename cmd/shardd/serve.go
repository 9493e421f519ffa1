package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/engine"
	"github.com/meshnet/shardd/frames"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/relay"
)

// version is reported as recipe_version; set with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	register(command{name: "serve", summary: "serve one shard over the Shard data plane (gRPC; also frames, directly or through a relay)", run: runServe})
}

func runServe(args []string) error {
	fs := newFlags("serve", "--model SHARD.gguf --listen ADDR [limits]",
		"Serves the layer range of SHARD.gguf (a file from 'shardd split', or a whole model) over\n"+
			"gRPC: meshnet.shard.v1.ShardRuntime, grpc.health.v1 and server reflection. With --relay it also\n"+
			"registers at a relay ('shardd relay') and serves the heads that reach it there, as frames of the same\n"+
			"messages (--frames-listen: the same frames on a direct address).\n"+
			"SIGTERM or SIGINT drains: new sessions are refused, open sessions and queued work finish, then it exits.\n"+
			"TLS: --tls-cert/--tls-key (TLS 1.3), --tls-client-ca for mutual TLS, on every transport (end to end\n"+
			"through a relay); SIGHUP reloads them.\n"+
			"Plaintext is served on loopback addresses only, unless --plaintext.")
	model := fs.String("model", "", "shard or model GGUF")
	listen := fs.String("listen", "127.0.0.1:7070", "address to listen on")
	tlsf := addServerTLS(fs)
	relayAt := fs.String("relay", "", "also serve through the relay at HOST:PORT/NAME (or relay://HOST:PORT/NAME): register there as NAME, dialling out, for heads that cannot reach this worker (README: Relayed hops)")
	framesListen := fs.String("frames-listen", "", "also serve the frame transport (what a relay carries) directly on this address; heads dial it as frames://ADDR")
	threads := fs.Int("threads", 0, "forward threads (0: all cores)")
	sessions := fs.Int("max-sessions", 16, "route sessions holding KV state at once (<= 255); more are refused at their first prefill, retryably, and their heads retry")
	ctxTokens := fs.Int("ctx-tokens", 0, "KV capacity in tokens shared by all sessions (0: the model's context length). A session that states its length (prompt + new tokens: the route client does) reserves it at its first prefill or is refused there, retryably; an admitted session's step takes cells from idle sessions (declared CACHE_MISS) rather than fail")
	batch := fs.Int("max-batch", 256, "most token rows in one forward call")
	iterTokens := fs.Int("iteration-tokens", 4, "least token budget of an iteration while sessions are decoding (decode steps first, prefill fills the rest); --decode-budget usually grants more")
	decodeBudget := fs.Duration("decode-budget", 0, "time an iteration carrying decode steps may take; prefill tokens are added while the measured cost model predicts it holds (0: 1.5x the decode rows' own measured time; negative: --iteration-tokens only)")
	prefillTokens := fs.Int("prefill-iteration-tokens", 128, "token budget of a prefill-only iteration while no session is decoding, and of the prompt tokens of any iteration while the prompts it would finish outnumber the sessions decoding")
	decodeGroups := fs.Int("decode-groups", 0, "a decode iteration waits (up to --gather-window) until 1/N of the decoding sessions are ready, so sessions move in N groups, and above 1 takes no more than that share: set N to the route's stage count (0: 1 for the whole model, 2 for a shard; negative: start with what has arrived)")
	gatherWindow := fs.Duration("gather-window", 0, "longest wait for that share (0: half the predicted time of the batch waited for)")
	decodeQuiet := fs.Duration("decode-quiet", 250*time.Millisecond, "how long after a decode step iterations stay at --iteration-tokens")
	queue := fs.Int("max-queue", 256, "work items queued across all sessions before RESOURCE_EXHAUSTED")
	inflight := fs.Uint("max-inflight", 8, "un-acked chunks one session may have outstanding")
	chunkBytes := fs.Uint64("max-chunk-bytes", 8<<20, "largest serialized chunk message")
	chunkTokens := fs.Uint("max-prefill-chunk-tokens", 512, "most tokens in one prefill chunk")
	ttl := fs.Duration("session-ttl", 10*time.Minute, "drop an idle session's KV state after this long")
	deterministic := fs.Bool("deterministic", false, "bitwise reproducible sessions: every forward carries one session's rows, whole, and each session has a KV stream of its own (at most --ctx-tokens/(--max-sessions+1) tokens), so a session's logits do not depend on what else runs; costs the batching across sessions (PERF.md); part of the recipe")
	evictGrace := fs.Duration("evict-grace", 2*time.Second, "a session used within this long is not evicted to make room for another; the newcomer is refused RESOURCE_EXHAUSTED (retryable) instead (negative: evict any idle session)")
	resultsBytes := fs.Int64("results-cache-bytes", 64<<20, "bytes of finished results kept to answer duplicate steps (idempotency); the oldest go first")
	boundary := fs.String("boundary", "bf16", "dtype of hidden states sent to the next shard: bf16 (the contract's canonical; bitwise the whole model rounded where the route rounds, see verify) or f32 (bitwise the unrounded whole model); bitwise for a session alone, or under any load with --deterministic")
	requireCRC := fs.Bool("require-checksum", true, "refuse tensors without a CRC32C")
	drainTimeout := fs.Duration("drain-timeout", 30*time.Second, "how long a drain waits for open sessions and queued work")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	tf := addTelemetryFlags(fs)
	poll := fs.Int("poll", 0, "llama.cpp threadpool polling after a forward, 0..100: spinning answers the next step sooner but burns the cores; keep 0 where workers share a machine")
	pin := fs.String("pin-threads", "auto", "pin the forward threads one per CPU: on, off, or auto (on when --threads uses every CPU this process may run on, as with taskset or a cpuset); two compute threads sharing a CPU stall llama.cpp's spinning barriers")
	verbose := fs.Bool("verbose", false, "pass llama.cpp's own logs through")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := required(fs, "model"); err != nil {
		return err
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	bd := shardv1.DType_DTYPE_BFLOAT16
	switch *boundary {
	case "bf16":
	case "f32":
		bd = shardv1.DType_DTYPE_FLOAT32
	default:
		return fmt.Errorf("--boundary must be bf16 or f32")
	}
	if *sessions < 1 || *sessions > 255 {
		return fmt.Errorf("--max-sessions must be 1..255")
	}
	if *resultsBytes < 1 {
		return fmt.Errorf("--results-cache-bytes must be positive")
	}
	var pinThreads bool
	switch *pin {
	case "on":
		pinThreads = true
	case "off":
	case "auto":
		pinThreads = llamacpp.PinAuto(*threads)
	default:
		return fmt.Errorf("--pin-threads must be on, off or auto")
	}

	meta, err := gguf.Read(*model)
	if err != nil {
		return err
	}
	if os.Getenv("SHARDD_BUFPOOL_TRACE") == "1" {
		bufpool.Default.Trace()
	}
	tel, err := tf.setup(*listen)
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	if tel.MetricsAddr != "" {
		log.Info("metrics", "listen", tel.MetricsAddr)
		// A line scripts read (--metrics-listen may pick a free port).
		fmt.Printf("shardd: metrics on %s\n", tel.MetricsAddr)
	}
	be, err := llamacpp.OpenMeta(llamacpp.Config{
		Path: *model, Threads: *threads, MaxSeqs: *sessions + 1, CtxTokens: *ctxTokens, MaxBatch: *batch, Poll: *poll, Verbose: *verbose,
		PinThreads: pinThreads, SeparateKV: *deterministic,
	}, meta)
	if err != nil {
		return err
	}
	defer be.Close()

	eng := engine.New(engine.Config{
		MaxSessions: *sessions, SessionTTL: *ttl, EvictGrace: *evictGrace, MaxQueue: *queue, Deterministic: *deterministic,
		IterationTokens: *iterTokens, PrefillIterationTokens: *prefillTokens, DecodeQuiet: *decodeQuiet, DecodeBudget: *decodeBudget,
		DecodeGroups: *decodeGroups, GatherWindow: *gatherWindow,
		MaxInflightChunks: uint32(*inflight), MaxChunkBytes: *chunkBytes, MaxPrefillChunkTokens: uint32(*chunkTokens),
		RequireChecksum: *requireCRC, Boundary: bd, Version: version, ResultsCacheBytes: *resultsBytes,
		TracerProvider: tel.TracerProvider(), MeterProvider: tel.Meter,
	}, be, meta, log)
	defer eng.Close()

	var relayAddr, relayName string
	if *relayAt != "" {
		u := *relayAt
		if !strings.HasPrefix(u, "relay://") {
			u = "relay://" + u
		}
		if relayAddr, relayName, err = relay.ParseURL(u); err != nil {
			return fmt.Errorf("--relay: %w", err)
		}
	}
	tlsCfg, err := tlsf.config(nonEmpty(*listen, *framesListen, relayAddr), log)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	opts := eng.ServerOptions()
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	srv := grpc.NewServer(opts...)
	shardv1.RegisterShardRuntimeServer(srv, eng)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	servingStatus := healthpb.HealthCheckResponse_SERVING
	if eng.State() != shardv1.ServingState_SERVING_STATE_SERVING {
		servingStatus = healthpb.HealthCheckResponse_NOT_SERVING
	}
	hs.SetServingStatus("", servingStatus)
	hs.SetServingStatus(shardv1.ShardRuntime_ServiceDesc.ServiceName, servingStatus)

	info := be.Info()
	log.Info("serving", "listen", lis.Addr().String(), "layers", fmt.Sprintf("%d:%d of %d", meta.Start, meta.End, meta.Total),
		"tokens_in", info.TokensIn, "logits_out", info.LogitsOut, "threads", info.Threads, "pinned", be.Pinned(), "state", eng.State().String(),
		"model_digest", eng.Identity().Fingerprint.ModelArtifactDigest, "recipe_digest", eng.Identity().Fingerprint.RuntimeRecipeDigest)
	log.Info("kv", "tokens", info.CtxTokens, "sessions", *sessions, "tokens_per_session_all_open", info.CtxTokens/max(*sessions, 1),
		"admission", "a session reserves the length it states at its first prefill, or is refused retryably; steps of admitted sessions preempt idle sessions rather than fail")
	// A line scripts wait for.
	fmt.Printf("shardd: listening on %s\n", lis.Addr())

	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(lis) }()
	fsrv, err := serveFrames(eng, log, tlsCfg, *framesListen, relayAddr, relayName, errc)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
wait:
	for {
		select {
		case err := <-errc:
			return err
		case s := <-sig:
			if s == syscall.SIGUSR1 {
				// With SHARDD_BUFPOOL_TRACE=1: where the pooled buffers
				// still out were taken (a leak hunt).
				n := bufpool.Default.DumpOutstanding(os.Stderr)
				log.Info("pooled buffers", "outstanding", bufpool.Default.Outstanding(), "traced", n)
				if n > 0 {
					// Who may still hold them: every goroutine's stack.
					pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
				}
				continue
			}
			if s == syscall.SIGHUP {
				if tlsf.reloader == nil {
					continue
				}
				if err := tlsf.reloader.Reload(); err != nil {
					log.Error("TLS reload failed; the previous certificate stays", "err", err)
				} else {
					log.Info("TLS certificate reloaded")
				}
				continue
			}
			log.Info("draining", "signal", s.String())
			break wait
		}
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(shardv1.ShardRuntime_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	ctx, cancel := context.WithTimeout(context.Background(), *drainTimeout)
	defer cancel()
	if err := eng.Drain(ctx); err != nil {
		log.Warn("drain incomplete", "err", err)
	}
	// Open streams end when their initiators close them; give them the
	// rest of the drain window, then stop.
	stopped := make(chan struct{})
	go func() {
		if fsrv != nil {
			fsrv.Shutdown(ctx)
		}
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-ctx.Done():
		srv.Stop()
	}
	log.Info("stopped")
	return nil
}

// serveFrames serves the engine on frame connections: accepted on
// framesListen, and through the relay at relayAddr as relayName (each
// optional). It prints a line for each, as scripts read "listening on".
// A listener that fails reports on errc. nil when neither is asked for.
func serveFrames(eng *engine.Engine, log *slog.Logger, tlsCfg *tls.Config, framesListen, relayAddr, relayName string, errc chan<- error) (*frames.Server, error) {
	var lns []net.Listener
	if framesListen != "" {
		ln, err := net.Listen("tcp", framesListen)
		if err != nil {
			return nil, err
		}
		log.Info("serving frames", "listen", ln.Addr().String())
		fmt.Printf("shardd: frames on %s\n", ln.Addr())
		lns = append(lns, ln)
	}
	if relayAddr != "" {
		rl, err := relay.Listen(relayAddr, relayName, relay.ListenOptions{Log: log})
		if err != nil {
			return nil, err
		}
		log.Info("serving through a relay", "url", rl.URL())
		fmt.Printf("shardd: relayed as %s\n", rl.URL())
		lns = append(lns, rl)
	}
	if len(lns) == 0 {
		return nil, nil
	}
	fsrv := eng.FrameServer(log)
	for _, ln := range lns {
		if tlsCfg != nil {
			// End to end with the head: a relay carries only ciphertext.
			ln = tls.NewListener(ln, tlsCfg)
		}
		go func() {
			if err := fsrv.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
				errc <- err
			}
		}()
	}
	return fsrv, nil
}

// nonEmpty drops empty strings.
func nonEmpty(ss ...string) []string {
	var out []string
	for _, s := range ss {
		if s != "" {
			out = append(out, s)
		}
	}
	return out
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(strings.ToUpper(level))); err != nil {
		return nil, fmt.Errorf("--log-level: %v", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
	slog.SetDefault(log)
	return log, nil
}

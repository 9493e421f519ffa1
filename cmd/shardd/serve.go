package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
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
	"github.com/meshnet/shardd/internal/feature"
	"github.com/meshnet/shardd/internal/hoststat"
	"github.com/meshnet/shardd/internal/idlepoll"
	"github.com/meshnet/shardd/relay"
)

// version is reported as recipe_version; set with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	register(command{name: "serve", summary: "serve one shard over the Shard data plane (gRPC; also frames, directly or through a relay)", run: runServe})
}

// serveConfig is serve's command line, parsed and validated by parseServe.
type serveConfig struct {
	model, listen, framesListen string
	// relayAddr and relayName: --relay, parsed.
	relayAddr, relayName string
	backend              llamacpp.Config
	engine               engine.Config
	// gpuFallback: serve on the CPU when --gpu-layers finds no device
	// (else refuse to start).
	gpuFallback  bool
	drainTimeout time.Duration
	// idlePoll: --idle-poll, the window the forward's CPUs are kept busy
	// after each forward (0: off).
	idlePoll time.Duration
	log      *slog.Logger
	tls      *tlsFlags
	tel      *telemetryFlags
}

// uint32Value is a flag.Value for an unsigned 32-bit setting.
type uint32Value struct{ p *uint32 }

func (v uint32Value) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatUint(uint64(*v.p), 10)
}

func (v uint32Value) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return err
	}
	*v.p = uint32(n)
	return nil
}

// uintFlag binds an unsigned 32-bit flag; a `word` in usage names its
// value in the help, as for the standard flags.
func uintFlag(fs *flag.FlagSet, p *uint32, name string, def uint32, usage string) {
	*p = def
	fs.Var(uint32Value{p}, name, usage)
}

// parseServe parses serve's flags into a serveConfig and validates it; it
// opens nothing.
func parseServe(args []string) (*serveConfig, error) {
	fs := newFlags("serve", "--model SHARD.gguf --listen ADDR [limits]",
		"Serves the layer range of SHARD.gguf (a file from 'shardd split', or a whole model) over\n"+
			"gRPC: meshnet.shard.v1.ShardRuntime, grpc.health.v1 and server reflection. With --relay it also\n"+
			"registers at a relay ('shardd relay') and serves the heads that reach it there, as frames of the same\n"+
			"messages (--frames-listen: the same frames on a direct address).\n"+
			"SIGTERM or SIGINT drains: new sessions are refused, open sessions and queued work finish, then it exits.\n"+
			"TLS: --tls-cert/--tls-key (TLS 1.3), --tls-client-ca for mutual TLS, on every transport (end to end\n"+
			"through a relay); SIGHUP reloads them.\n"+
			"Plaintext is served on loopback addresses only, unless --plaintext.")
	c := &serveConfig{}
	b, e := &c.backend, &c.engine
	fs.StringVar(&c.model, "model", "", "shard or model GGUF")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:7070", "address to listen on")
	c.tls = addServerTLS(fs)
	relayAt := fs.String("relay", "", "also serve through the relay at HOST:PORT/NAME (or relay://HOST:PORT/NAME): register there as NAME, dialling out, for heads that cannot reach this worker (README: Relayed hops)")
	fs.StringVar(&c.framesListen, "frames-listen", "", "also serve the frame transport (what a relay carries) directly on this address; heads dial it as frames://ADDR")
	fs.IntVar(&b.Threads, "threads", 0, "forward threads (0: all cores)")
	fs.IntVar(&e.MaxSessions, "max-sessions", 16, "route sessions holding KV state at once (<= 255); more are refused at their first prefill, retryably, and their heads retry")
	fs.IntVar(&b.CtxTokens, "ctx-tokens", 0, "KV capacity in tokens shared by all sessions (0: the model's context length). A session that states its length (prompt + new tokens: the route client does) reserves it at its first prefill or is refused there, retryably; an admitted session's step takes cells from idle sessions (declared CACHE_MISS) rather than fail")
	fs.IntVar(&b.MaxBatch, "max-batch", 256, "most token rows in one forward call")
	fs.IntVar(&e.IterationTokens, "iteration-tokens", 4, "least token budget of an iteration while sessions are decoding (decode steps first, prefill fills the rest); --decode-budget usually grants more")
	fs.DurationVar(&e.DecodeBudget, "decode-budget", 0, "time an iteration carrying decode steps may take; prefill tokens are added while the measured cost model predicts it holds (0: 1.5x the decode rows' own measured time; negative: --iteration-tokens only)")
	fs.IntVar(&e.PrefillIterationTokens, "prefill-iteration-tokens", 128, "token budget of a prefill-only iteration while no session is decoding, and of the prompt tokens of any iteration while prompts of at most this many tokens (or their chunks) wait, two or more and over two thirds as many as the sessions decoding")
	fs.IntVar(&e.DecodeGroups, "decode-groups", 0, "a decode iteration waits (up to --gather-window) until 1/N of the decoding sessions (rounded down) are ready, so sessions move in N groups, and above 1 takes no more than 1/N rounded up and counts a session whose prompt just completed as decoding: set N to the route's stage count (0: 1 for the whole model, 2 for a shard; negative: start with what has arrived)")
	fs.DurationVar(&e.GatherWindow, "gather-window", 0, "longest wait for that share (0: half the predicted time of the batch waited for)")
	fs.DurationVar(&e.DecodeQuiet, "decode-quiet", 250*time.Millisecond, "how long after a decode step iterations stay at --iteration-tokens")
	fs.IntVar(&e.MaxQueue, "max-queue", 256, "work items queued across all sessions before RESOURCE_EXHAUSTED")
	uintFlag(fs, &e.MaxInflightChunks, "max-inflight", 8, "un-acked `chunks` one session may have outstanding")
	fs.Uint64Var(&e.MaxChunkBytes, "max-chunk-bytes", 8<<20, "largest serialized chunk message")
	uintFlag(fs, &e.MaxPrefillChunkTokens, "max-prefill-chunk-tokens", 512, "most `tokens` in one prefill chunk")
	fs.DurationVar(&e.SessionTTL, "session-ttl", 10*time.Minute, "drop an idle session's KV state after this long")
	fs.BoolVar(&e.Exact, "exact", false, "the exact mode: a session's logits are bitwise its run alone, whatever else runs. Each session has a KV stream of its own (at most --ctx-tokens/(--max-sessions+1) tokens); decode forwards carry every ready session's step through a batch-invariant forward, prefill forwards prompt chunks of one length, each whole (PERF.md has the cost); part of the recipe")
	fs.BoolVar(&e.Exact, "deterministic", false, "the same as --exact (its earlier name)")
	fs.DurationVar(&e.EvictGrace, "evict-grace", 2*time.Second, "a session used within this long is not evicted to make room for another; the newcomer is refused RESOURCE_EXHAUSTED (retryable) instead (negative: evict any idle session)")
	fs.Int64Var(&e.ResultsCacheBytes, "results-cache-bytes", 64<<20, "bytes of finished results kept to answer duplicate steps (idempotency); the oldest go first")
	fs.Int64Var(&e.PrefixCacheBytes, "prefix-cache-bytes", 256<<20, "bytes of prompt prefixes kept per shard (their KV cells and output rows), found again by content so a repeated system prompt or conversation history is not computed again; least recently used first out; 0: no prefix cache (README: sizing)")
	withhold := fs.String("withhold-features", "", "optional behaviours ("+strings.Join(feature.All, ", ")+") this worker neither advertises nor accepts, comma-separated: it then behaves as a worker of a release without them (README: Upgrading a fleet)")
	fs.IntVar(&e.PrefixBlock, "prefix-block", 32, "positions per prefix cache block: a prompt's prefix is found again in whole blocks")
	boundary := fs.String("boundary", "bf16", "dtype of hidden states sent to the next shard: bf16 (the contract's canonical; bitwise the whole model rounded where the route rounds, see verify) or f32 (bitwise the unrounded whole model); bitwise for a session alone, or under any load with --exact")
	fs.BoolVar(&e.RequireChecksum, "require-checksum", true, "refuse tensors without a CRC32C")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "how long a drain waits for open sessions and queued work")
	fs.BoolVar(&e.DrainHandoff, "drain-handoff", false, "on a drain, refuse the open sessions' further steps too (retryable, Health DRAINING), so heads with a standby for this hop move them there and the worker exits once their streams close; for routes that all have standbys")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	c.tel = addTelemetryFlags(fs)
	gpuLayers := fs.String("gpu-layers", "0", "put this many of the shard's layers (from its last), and their KV cache, on a GPU; 'all': every layer and the output layer. Needs a GPU build (make build-cuda); 0: CPU only")
	fs.StringVar(&b.Device, "device", "", "with --gpu-layers: the GPU, by index or name (CUDA0); default: the first")
	gpuFallback := fs.String("gpu-fallback", "refuse", "with --gpu-layers and no usable GPU (a CPU-only build, no device, no driver): 'refuse' to start, or 'cpu' to serve every layer on the CPU (logged, and GetCapability's device says so)")
	fs.IntVar(&b.Poll, "poll", 0, "llama.cpp threadpool polling after a forward, 0..100: spinning answers the next step sooner but burns the cores; keep 0 where workers share a machine")
	fs.DurationVar(&c.idlePoll, "idle-poll", 0, "after each forward, keep this process's CPUs busy this long at the lowest priority (a thread per CPU at SCHED_IDLE, which any other thread preempts), so that on a VM a vCPU does not halt between a pipeline's forwards and wait for its host at the next (steal time; PERF.md, noise); needs as many forward threads as the process has CPUs (--threads 0, or taskset or a cpuset); burns the idle CPUs for the window; 0: off")
	pin := fs.String("pin-threads", "auto", "pin the forward threads one per CPU: on, off, or auto (on when --threads uses every CPU this process may run on, as with taskset or a cpuset); two compute threads sharing a CPU stall llama.cpp's spinning barriers")
	fs.BoolVar(&b.Verbose, "verbose", false, "pass llama.cpp's own logs through")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := required(fs, "model"); err != nil {
		return nil, err
	}
	for _, f := range strings.FieldsFunc(*withhold, func(r rune) bool { return r == ',' || r == ' ' }) {
		if !slices.Contains(feature.All, f) {
			return nil, fmt.Errorf("--withhold-features: %q is none of %s", f, strings.Join(feature.All, ", "))
		}
		c.engine.Withhold = append(c.engine.Withhold, f)
	}
	if err := c.validate(*boundary, *pin, *relayAt, *logLevel); err != nil {
		return nil, err
	}
	if err := c.validateGPU(*gpuLayers, *gpuFallback); err != nil {
		return nil, err
	}
	return c, nil
}

// validate checks the values flags cannot, and derives the backend's and
// the engine's settings from them.
func (c *serveConfig) validate(boundary, pin, relayAt, logLevel string) error {
	b, e := &c.backend, &c.engine
	switch boundary {
	case "bf16":
		e.Boundary = shardv1.DType_DTYPE_BFLOAT16
	case "f32":
		e.Boundary = shardv1.DType_DTYPE_FLOAT32
	default:
		return fmt.Errorf("--boundary must be bf16 or f32")
	}
	if e.MaxSessions < 1 || e.MaxSessions > 255 {
		return fmt.Errorf("--max-sessions must be 1..255")
	}
	if e.ResultsCacheBytes < 1 {
		return fmt.Errorf("--results-cache-bytes must be positive")
	}
	if e.PrefixCacheBytes < 0 || e.PrefixBlock < 1 || e.PrefixBlock > 4096 {
		return fmt.Errorf("--prefix-cache-bytes must be 0 or more and --prefix-block 1..4096")
	}
	if e.PrefixCacheBytes == 0 {
		e.PrefixCacheBytes = -1 // the engine's "off"
	}
	switch pin {
	case "on":
		b.PinThreads = true
	case "off":
	case "auto":
		b.PinThreads = llamacpp.PinAuto(b.Threads)
	default:
		return fmt.Errorf("--pin-threads must be on, off or auto")
	}
	if c.idlePoll < 0 || c.idlePoll > 0 && !llamacpp.PinAuto(b.Threads) {
		return fmt.Errorf("--idle-poll needs a CPU for each forward thread and no more: --threads %d, and this process may run on %d CPUs (taskset or a cpuset)", b.Threads, runtime.NumCPU())
	}
	if relayAt != "" {
		if !strings.HasPrefix(relayAt, "relay://") {
			relayAt = "relay://" + relayAt
		}
		var err error
		if c.relayAddr, c.relayName, err = relay.ParseURL(relayAt); err != nil {
			return fmt.Errorf("--relay: %w", err)
		}
	}
	// One sequence more than sessions: the engine keeps one for stateless work.
	b.Path, b.MaxSeqs, b.SeparateKV = c.model, e.MaxSessions+1, e.Exact
	e.Version = version
	var err error
	c.log, err = newLogger(logLevel)
	return err
}

// validateGPU parses --gpu-layers and --gpu-fallback.
func (c *serveConfig) validateGPU(layers, fallback string) error {
	b := &c.backend
	switch n, err := strconv.Atoi(layers); {
	case layers == "all":
		b.GPULayers = llamacpp.AllLayers
	case err != nil || n < 0:
		return fmt.Errorf("--gpu-layers must be a number of layers (0 or more) or all")
	default:
		b.GPULayers = n
	}
	switch fallback {
	case "refuse":
	case "cpu":
		c.gpuFallback = true
	default:
		return fmt.Errorf("--gpu-fallback must be refuse or cpu")
	}
	if b.Device != "" && b.GPULayers == 0 {
		return fmt.Errorf("--device needs --gpu-layers")
	}
	if b.GPULayers != 0 && c.engine.Exact {
		// The exact mode rests on every CPU kernel being batch-invariant
		// (TestOpVariance); CUDA's choose kernels and splits by batch size.
		return fmt.Errorf("--exact runs on the CPU only: its batch invariance is proven for ggml's CPU kernels, not CUDA's (README: The GPU forward)")
	}
	return nil
}

// openBackend opens the shard where --gpu-layers says; with no usable GPU
// it refuses, or with --gpu-fallback cpu serves on the CPU and says so.
func (c *serveConfig) openBackend(meta gguf.Meta) (*llamacpp.Backend, error) {
	be, err := llamacpp.OpenMeta(c.backend, meta)
	if err == nil || !errors.Is(err, llamacpp.ErrNoGPU) {
		return be, err
	}
	if !c.gpuFallback {
		return nil, fmt.Errorf("serve: --gpu-layers: %w (--gpu-fallback cpu serves on the CPU instead)", err)
	}
	c.log.Warn("no usable GPU: serving every layer on the CPU (--gpu-fallback cpu)", "reason", err.Error())
	cpu := c.backend
	cpu.GPULayers, cpu.Device = 0, ""
	return llamacpp.OpenMeta(cpu, meta)
}

// startIdlePoll starts --idle-poll's threads on the CPUs this process may
// run on, which its forward threads take one each.
func (c *serveConfig) startIdlePoll() (*idlepoll.Poller, error) {
	cpus, err := hoststat.AllowedCPUs()
	if err != nil {
		return nil, fmt.Errorf("serve: --idle-poll: %w", err)
	}
	ip, err := idlepoll.Start(cpus, c.idlePoll)
	if err != nil {
		return nil, fmt.Errorf("serve: --idle-poll: %w", err)
	}
	c.log.Info("idle poll", "cpus", cpus, "window", c.idlePoll)
	return ip, nil
}

func runServe(args []string) error {
	c, err := parseServe(args)
	if err != nil {
		return err
	}
	return c.run()
}

// run serves until a signal drains it (or a listener fails).
func (c *serveConfig) run() error {
	meta, err := gguf.Read(c.model)
	if err != nil {
		return err
	}
	if os.Getenv("SHARDD_BUFPOOL_TRACE") == "1" {
		bufpool.Default.Trace()
	}
	tel, err := c.tel.setup(c.listen)
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	if tel.MetricsAddr != "" {
		c.log.Info("metrics", "listen", tel.MetricsAddr)
		// A line scripts read (--metrics-listen may pick a free port).
		fmt.Printf("shardd: metrics on %s\n", tel.MetricsAddr)
	}
	be, err := c.openBackend(meta)
	if err != nil {
		return err
	}
	defer be.Close()
	ecfg := c.engine
	ecfg.TracerProvider, ecfg.MeterProvider = tel.TracerProvider(), tel.Meter
	if c.idlePoll > 0 {
		ip, err := c.startIdlePoll()
		if err != nil {
			return err
		}
		defer ip.Stop()
		ecfg.IdlePoll = ip
	}
	eng := engine.New(ecfg, be, meta, c.log)
	defer eng.Close()
	c.limitGoHeap()

	tlsCfg, err := c.tls.config(nonEmpty(c.listen, c.framesListen, c.relayAddr), c.log)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	lis, err := net.Listen("tcp", c.listen)
	if err != nil {
		return err
	}
	srv, hs := grpcServer(eng, tlsCfg)
	c.logServing(lis.Addr(), be, meta, eng)
	// A line scripts wait for.
	fmt.Printf("shardd: listening on %s\n", lis.Addr())

	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(lis) }()
	fsrv, err := serveFrames(eng, c.log, tlsCfg, c.framesListen, c.relayAddr, c.relayName, errc)
	if err != nil {
		return err
	}
	if err := c.waitSignals(errc); err != nil {
		return err
	}
	setHealth(hs, healthpb.HealthCheckResponse_NOT_SERVING)
	c.drain(eng, srv, fsrv)
	return nil
}

// goHeapBase is what the Go heap may hold beside the results and prefix
// caches before its collector works harder: streams' gRPC buffers, pooled
// buffers, queued work. Idle workers hold 10-20 MiB of it.
const goHeapBase = 128 << 20

// limitGoHeap sets the Go heap's soft limit (runtime/debug.SetMemoryLimit)
// to the caches' budgets plus goHeapBase, unless GOMEMLIMIT sets one. The
// caches are the Go memory a worker grows into, and with the collector's
// default pacing a heap may reach twice what it holds live; with the limit
// it collects sooner instead, so RSS stays near model + KV + budgets
// (README: Memory).
func (c *serveConfig) limitGoHeap() {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := c.engine.ResultsCacheBytes + max(c.engine.PrefixCacheBytes, 0) + goHeapBase
	debug.SetMemoryLimit(limit)
	c.log.Info("memory", "go_heap_soft_limit_mib", limit>>20, "results_cache_mib", c.engine.ResultsCacheBytes>>20,
		"prefix_cache_mib", max(c.engine.PrefixCacheBytes, 0)>>20)
}

// grpcServer registers the engine, health and reflection on a gRPC server.
func grpcServer(eng *engine.Engine, tlsCfg *tls.Config) (*grpc.Server, *health.Server) {
	opts := eng.ServerOptions()
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	srv := grpc.NewServer(opts...)
	shardv1.RegisterShardRuntimeServer(srv, eng)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(srv, hs)
	reflection.Register(srv)
	status := healthpb.HealthCheckResponse_SERVING
	if eng.State() != shardv1.ServingState_SERVING_STATE_SERVING {
		status = healthpb.HealthCheckResponse_NOT_SERVING
	}
	setHealth(hs, status)
	return srv, hs
}

func setHealth(hs *health.Server, status healthpb.HealthCheckResponse_ServingStatus) {
	hs.SetServingStatus("", status)
	hs.SetServingStatus(shardv1.ShardRuntime_ServiceDesc.ServiceName, status)
}

func (c *serveConfig) logServing(addr net.Addr, be *llamacpp.Backend, meta gguf.Meta, eng *engine.Engine) {
	info := be.Info()
	c.log.Info("serving", "listen", addr.String(), "layers", fmt.Sprintf("%d:%d of %d", meta.Start, meta.End, meta.Total),
		"tokens_in", info.TokensIn, "logits_out", info.LogitsOut, "device", info.Device, "threads", info.Threads, "pinned", be.Pinned(), "state", eng.State().String(),
		"model_digest", eng.Identity().Fingerprint.ModelArtifactDigest, "recipe_digest", eng.Identity().Fingerprint.RuntimeRecipeDigest)
	sessions := c.engine.MaxSessions
	c.log.Info("kv", "tokens", info.CtxTokens, "sessions", sessions, "tokens_per_session_all_open", info.CtxTokens/max(sessions, 1),
		"admission", "a session reserves the length it states at its first prefill, or is refused retryably; steps of admitted sessions preempt idle sessions rather than fail")
}

// waitSignals returns nil at SIGTERM or SIGINT (drain), or a listener's
// error. SIGHUP reloads the TLS certificate; SIGUSR1 dumps where the pooled
// buffers still out were taken (with SHARDD_BUFPOOL_TRACE=1: a leak hunt).
func (c *serveConfig) waitSignals(errc <-chan error) error {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	defer signal.Stop(sig)
	for {
		select {
		case err := <-errc:
			return err
		case s := <-sig:
			switch s {
			case syscall.SIGUSR1:
				n := bufpool.Default.DumpOutstanding(os.Stderr)
				c.log.Info("pooled buffers", "outstanding", bufpool.Default.Outstanding(), "traced", n)
				if n > 0 {
					// Who may still hold them: every goroutine's stack.
					pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
				}
			case syscall.SIGHUP:
				c.reloadTLS()
			default:
				c.log.Info("draining", "signal", s.String())
				return nil
			}
		}
	}
}

func (c *serveConfig) reloadTLS() {
	if c.tls.reloader == nil {
		return
	}
	if err := c.tls.reloader.Reload(); err != nil {
		c.log.Error("TLS reload failed; the previous certificate stays", "err", err)
	} else {
		c.log.Info("TLS certificate reloaded")
	}
}

// drain refuses new sessions, lets open ones and queued work finish within
// --drain-timeout, then stops the servers.
func (c *serveConfig) drain(eng *engine.Engine, srv *grpc.Server, fsrv *frames.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), c.drainTimeout)
	defer cancel()
	if err := eng.Drain(ctx); err != nil {
		c.log.Warn("drain incomplete", "err", err)
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
	c.log.Info("stopped")
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

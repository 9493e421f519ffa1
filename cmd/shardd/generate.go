package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/meshnet/shardd/backend/llamacpp"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/chat"
	"github.com/meshnet/shardd/internal/recipe"
	"github.com/meshnet/shardd/route"
	"github.com/meshnet/shardd/verify"
)

func init() {
	register(command{name: "generate", summary: "drive a generation through a route of shardd workers", run: runGenerate})
}

// genFlags are generate's flags.
type genFlags struct {
	route, promptTokens, prompt, system, chatTemplate, tokenizer, verifyModel *string
	chat, compact, replay                                                     *bool
	maxTokens, topK, chunk, pipeChunks                                        *int
	temperature, topP                                                         *float64
	seed                                                                      *uint64
	timeout, overall                                                          *time.Duration
	tls                                                                       *tlsFlags
	tel                                                                       *telemetryFlags
}

func parseGenerate(args []string) (*genFlags, error) {
	fs := newFlags("generate", "--route ADDR1,ADDR2[,...] (--prompt-tokens 1,2,3 | --prompt TEXT [--chat] --tokenizer FILE.gguf) [flags]",
		"Sends the prompt through the route (first worker first), samples at the head, streams tokens\n"+
			"(or, with a tokenizer, text) as they come, stops at the model's end-of-generation tokens, and\n"+
			"prints per-hop and total timing at the end.")
	f := &genFlags{}
	f.route = fs.String("route", "", routeHelp)
	f.tls = addClientTLS(fs)
	f.promptTokens = fs.String("prompt-tokens", "", "comma-separated prompt token ids")
	f.prompt = fs.String("prompt", "", "prompt text, tokenized with the model's tokenizer (--tokenizer, else --verify-model)")
	f.chat = fs.Bool("chat", false, "treat --prompt as a user message and apply the model's own chat template (tokenizer.chat_template); a GGUF with none (a base model) gets a plain \"Q: ...\\nA:\" transcript and the answer ends at its first line")
	f.system = fs.String("system", "", "with --chat: a system message before the user's")
	f.chatTemplate = fs.String("chat-template", "", "with --chat: one of llama.cpp's built-in templates (chatml, gemma, llama3, ...) instead of the model's own; for a GGUF that carries none (base models)")
	f.tokenizer = fs.String("tokenizer", "", "GGUF whose vocabulary tokenizes --prompt and prints the tokens as text: the whole model or the route's first shard (a vocab-only load; default: --verify-model)")
	f.maxTokens = fs.Int("max-tokens", 16, "tokens to generate")
	f.temperature = fs.Float64("temperature", 0, "sampling temperature (0: greedy)")
	f.topK = fs.Int("top-k", 0, "keep the K most likely tokens (0: all)")
	f.topP = fs.Float64("top-p", 0, "nucleus sampling threshold (0: off)")
	f.seed = fs.Uint64("seed", 1, "sampling seed")
	f.compact = fs.Bool("compact-logits", false, "ask the last hop for the best K logits only where sampling needs no more (greedy: K=1; --top-k k: K=k), not the whole vocabulary's: the same tokens, 8K bytes a token instead of 4 x vocab")
	f.chunk = fs.Int("prefill-chunk", 0, "tokens per prefill chunk (0: what the workers grant, at most 128)")
	f.pipeChunks = fs.Int("pipeline-chunks", 0, pipelineChunksHelp)
	f.replay = fs.Bool("replay-recovery", false, "rebuild a session a worker lost in the shapes it was built in (prompt chunks, then a decode step per generated token): with --exact workers the tokens after a recovery equal an uninterrupted run's")
	f.timeout = fs.Duration("step-timeout", 60*time.Second, "deadline of one step on one worker; a worker that does not answer within it (after --step-timeout x 4 with the retries) fails the generation")
	f.overall = fs.Duration("timeout", 0, "deadline of the whole generation, connecting included (0: none)")
	f.tel = addTelemetryFlags(fs)
	f.verifyModel = fs.String("verify-model", "", "whole-model GGUF: also generate greedily in this process and check the tokens match; the reference rounds to bf16 after each hop that returned bf16, as the route does, and prefills the prompt in one forward (README: Boundary dtype and exactness)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := required(fs, "route"); err != nil {
		return nil, err
	}
	if *f.verifyModel != "" && *f.temperature != 0 {
		return nil, fmt.Errorf("--verify-model compares greedy generations; leave --temperature at 0")
	}
	if *f.tokenizer == "" {
		*f.tokenizer = *f.verifyModel
	}
	return f, nil
}

func runGenerate(args []string) error {
	f, err := parseGenerate(args)
	if err != nil {
		return err
	}
	var tok *llamacpp.Tokenizer
	if *f.tokenizer != "" && (*f.prompt != "" || *f.promptTokens == "") {
		if tok, err = llamacpp.OpenTokenizer(*f.tokenizer); err != nil {
			return err
		}
		defer tok.Close()
	}
	ids, plain, err := promptIDs(*f.promptTokens, *f.prompt, chatSpec{on: *f.chat, system: *f.system, template: *f.chatTemplate}, tok)
	if err != nil {
		return err
	}
	if plain {
		fmt.Fprintln(os.Stderr, "generate: the model carries no chat template (a base model): asking in a plain Q:/A: transcript, the answer ending at its first line; --chat-template NAME forces one")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if *f.overall > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *f.overall)
		defer cancel()
	}
	tel, err := f.tel.setup("head")
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	r, err := f.dial(ctx, tel.TracerProvider())
	if err != nil {
		return err
	}
	defer r.Close()
	fmt.Printf("route: %d hops, prompt of %d tokens\n", len(r.Hops), len(ids))
	printRecipes(os.Stdout, r)
	req := route.Request{Prompt: ids, MaxTokens: *f.maxTokens,
		Sampling: route.Sampling{Temperature: *f.temperature, TopK: *f.topK, TopP: *f.topP, Seed: *f.seed}}
	if tok != nil {
		req.Stop = chat.Stopper(tok, plain)
	}
	got, st, err := streamTokens(ctx, r, req, tok)
	if err != nil {
		return err
	}
	printStats(st)
	if *f.verifyModel != "" {
		return verifyTokens(*f.verifyModel, r, st, ids, got)
	}
	return nil
}

// printRecipes prints each hop's runtime recipe (its digest and the lines
// that name its kernels) and, for a route of mixed recipes, how they
// differ: such a route generates, but bits are comparable across hops only
// where recipes are equal.
func printRecipes(w io.Writer, r *route.Route) {
	first := r.Hops[0].Recipe()
	for i, h := range r.Hops {
		digest := strings.TrimPrefix(h.Current().GetFingerprint().GetRuntimeRecipeDigest(), "sha256:")
		fmt.Fprintf(w, "hop %d %s: recipe %.16s", i, h.Addr, digest)
		for _, l := range strings.Split(h.Recipe(), recipe.Sep) {
			if strings.HasPrefix(l, "isa=") || strings.HasPrefix(l, "backend=") {
				fmt.Fprintf(w, ", %s", l)
			}
		}
		fmt.Fprintln(w)
		if i > 0 {
			for _, d := range recipe.Diff(first, h.Recipe()) {
				fmt.Fprintf(w, "  differs from hop 0: %s\n", d)
			}
		}
	}
	if r.Mixed() {
		fmt.Fprintln(w, "route: the hops run different recipes; each computes its own layers exactly as its build does, "+
			"and bitwise comparisons across builds (--verify-model, --replay-recovery onto another build) do not hold")
	}
}

// dial connects the route with the flags' TLS and options.
func (f *genFlags) dial(ctx context.Context, tp trace.TracerProvider) (*route.Route, error) {
	hops, alts, tlsCfg, err := routeSpec(*f.route, f.tls)
	if err != nil {
		return nil, err
	}
	return route.Dial(ctx, hops, route.Options{StepTimeout: *f.timeout, PrefillChunk: *f.chunk, PipelineChunks: *f.pipeChunks, TracerProvider: tp,
		TLS: tlsCfg, ReplayRecovery: *f.replay, CompactLogits: *f.compact, Alternates: alts})
}

// routeHelp describes --route for every command that drives a route.
const routeHelp = "comma-separated hops in layer order, each HOST:PORT (gRPC), relay://HOST:PORT/NAME (through a relay) or frames://HOST:PORT; " +
	"'|' adds standbys a failed hop moves to, in order (a|a2,b|b2)"

// routeSpec reads --route (route.ParseRoute) and the TLS flags for its
// workers, standbys included.
func routeSpec(spec string, tf *tlsFlags) (hops []string, alts [][]string, cfg *tls.Config, err error) {
	if hops, alts, err = route.ParseRoute(spec); err != nil {
		return nil, nil, nil, err
	}
	var netAddrs []string
	for _, hop := range slices.Concat(append([][]string{hops}, alts...)...) {
		netAddrs = append(netAddrs, route.NetAddr(hop))
	}
	cfg, err = tf.config(netAddrs, nil)
	return hops, alts, cfg, err
}

// streamTokens generates, printing each token (as text with a tokenizer)
// as it comes.
func streamTokens(ctx context.Context, r *route.Route, req route.Request, tok *llamacpp.Tokenizer) ([]int32, route.Stats, error) {
	var got []int32
	st, err := r.Generate(ctx, req, func(t int32) error {
		got = append(got, t)
		if tok != nil {
			fmt.Printf("%s", tok.Piece(t))
		} else {
			fmt.Printf("%d ", t)
		}
		return nil
	})
	fmt.Println()
	return got, st, err
}

// verifyTokens generates greedily with the whole model in this process and
// compares. The reference computes what the route does: the whole model,
// rounded to bf16 after each hop that returned bf16.
func verifyTokens(model string, r *route.Route, st route.Stats, ids, got []int32) error {
	var round []int
	for i, h := range st.Hops[:len(st.Hops)-1] {
		if h.Output == shardv1.DType_DTYPE_BFLOAT16 {
			round = append(round, int(r.Hops[i].Capability.GetShardRange().GetEndLayer())-1)
		}
	}
	want, err := verify.Greedy(model, ids, len(got), 0, round...)
	if err != nil {
		return err
	}
	ref := "the unsplit model"
	if len(round) > 0 {
		ref = fmt.Sprintf("the unsplit model rounded to bf16 after layers %v, as the route rounds", round)
	}
	var other []string // hops whose kernels are not this process's
	for _, h := range r.Hops {
		for _, d := range recipe.Diff(strings.Join(llamacpp.Kernels(), recipe.Sep), kernelLines(h.Recipe())) {
			other = append(other, h.Addr+" "+d)
		}
	}
	if !slices.Equal(got, want) {
		if len(other) > 0 {
			return fmt.Errorf("MISMATCH: the route generated %v; the reference (%s, in this process) %v; "+
				"bitwise equality is promised only between equal recipes, and these differ: %s", got, ref, want, strings.Join(other, "; "))
		}
		return fmt.Errorf("MISMATCH: the route generated %v; the reference (%s) %v", got, ref, want)
	}
	fmt.Printf("tokens: %v\nmatch: the route's tokens equal those of %s\n", got, ref)
	return nil
}

// kernelLines keeps the lines of a recipe (recipe.Sep apart) that name
// kernels: the build and the instruction set.
func kernelLines(r string) string {
	var out []string
	for _, l := range strings.Split(r, recipe.Sep) {
		if strings.HasPrefix(l, "build=") || strings.HasPrefix(l, "isa=") {
			out = append(out, l)
		}
	}
	return strings.Join(out, recipe.Sep)
}

// chatSpec says whether and how a prompt is rendered as a chat.
type chatSpec struct {
	on               bool
	system, template string
}

// promptIDs is the prompt as token ids: given as ids, or text tokenized
// with tok (after the chat template when chat.on). plain reports a chat
// rendered as a plain Q:/A: transcript, for a model with no template.
func promptIDs(ids, text string, spec chatSpec, tok *llamacpp.Tokenizer) (out []int32, plain bool, err error) {
	switch {
	case ids != "" && text != "":
		return nil, false, fmt.Errorf("give --prompt-tokens or --prompt, not both")
	case ids != "":
		if spec.on {
			return nil, false, fmt.Errorf("--chat needs --prompt text")
		}
		for _, s := range splitList(ids) {
			v, err := strconv.ParseInt(s, 10, 32)
			if err != nil {
				return nil, false, fmt.Errorf("bad --prompt-tokens item %q", s)
			}
			out = append(out, int32(v))
		}
		return out, false, nil
	case text == "":
		return nil, false, fmt.Errorf("give --prompt-tokens, or --prompt with --tokenizer (or --verify-model)")
	case tok == nil:
		return nil, false, fmt.Errorf("--prompt needs the model's tokenizer: give --tokenizer FILE.gguf (the whole model or the route's first shard) or --verify-model")
	case !spec.on && (spec.system != "" || spec.template != ""):
		return nil, false, fmt.Errorf("--system and --chat-template need --chat")
	}
	if spec.on {
		if text, plain, err = renderChat(tok, spec, text); err != nil {
			return nil, false, err
		}
	}
	out, err = tok.Encode(text)
	return out, plain, err
}

// renderChat renders one user message (after an optional system message)
// with the chat template, or as a plain transcript when the model has none.
func renderChat(tok *llamacpp.Tokenizer, spec chatSpec, user string) (string, bool, error) {
	var msgs []llamacpp.Message
	if spec.system != "" {
		msgs = append(msgs, llamacpp.Message{Role: "system", Content: spec.system})
	}
	return chat.Render(tok, append(msgs, llamacpp.Message{Role: "user", Content: user}), spec.template)
}

func printStats(st route.Stats) {
	per := func(d time.Duration, n int) string {
		if n == 0 {
			return "-"
		}
		return (d / time.Duration(n)).Round(time.Microsecond).String()
	}
	decodeTokens := max(st.Tokens-1, 0)
	fmt.Printf("session %s: %d prompt tokens, %d generated\n", st.SessionID, st.PromptTokens, st.Tokens)
	for _, c := range st.RecipeChanges {
		fmt.Printf("recovered onto another recipe (the generation's bits after it are that build's): %s\n", c)
	}
	fmt.Printf("time to first token %s; decode %s", st.Prefill.Round(time.Millisecond), st.Decode.Round(time.Millisecond))
	if decodeTokens > 0 && st.Decode > 0 {
		fmt.Printf(" (%.1f tokens/s)", float64(decodeTokens)/st.Decode.Seconds())
	}
	fmt.Println()
	var b strings.Builder
	fmt.Fprintf(&b, "%-22s %6s %12s %12s %12s %12s\n", "hop", "calls", "wall/call", "exec/call", "overhead", "out B/call")
	for _, h := range st.Hops {
		outPer := "-"
		if h.Calls > 0 {
			outPer = strconv.FormatInt(h.OutBytes/int64(h.Calls), 10)
		}
		fmt.Fprintf(&b, "%-22s %6d %12s %12s %12s %12s\n", h.Addr, h.Calls, per(h.Wall, h.Calls), per(h.Exec, h.Calls), per(h.Wall-h.Exec, h.Calls), outPer)
	}
	fmt.Print(b.String())
	if st.Compact > 0 {
		fmt.Printf("compact output: the last hop returned the best %d logits of each row\n", st.Compact)
	}
	if st.Retries+st.Recoveries+st.DuplicateAcks+st.Busy > 0 {
		fmt.Printf("retries %d, re-prefills after cache miss %d, duplicate acks %d, refusals of a full worker ridden out %d (waited %s)\n",
			st.Retries, st.Recoveries, st.DuplicateAcks, st.Busy, st.BusyWait.Round(time.Millisecond))
	}
}

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
	"github.com/meshnet/shardd/internal/tlsconf/tlstest"
	"github.com/meshnet/shardd/load"
	"github.com/meshnet/shardd/verify"
)

// `shardd api` over a real route of SmolLM2, driven by the official openai
// Python package (api/testdata/openai_client.py: chat and completions,
// streamed and not, usage, a stop string, Unicode, 401, 429, a client
// that disconnects, bad bodies), and token for token equal to `shardd
// generate` on the same route and prompt.
func TestOpenAIClient(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shardd and runs real processes")
	}
	python := os.Getenv("SHARDD_PYTHON")
	if python == "" {
		t.Skip("SHARDD_PYTHON is unset: `make test` sets it to a Python with the openai package (make pyenv)")
	}
	model, err := verify.RealModel("smollm2")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := buildShardd(t, dir)
	shards, err := gguf.Split(model, gguf.EvenRanges(30, 2), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := load.StartWorkers(context.Background(), bin, dir, []load.WorkerSpec{
		{Model: shards[0], Name: "hop0", Threads: 1, Args: []string{"--metrics-listen", "127.0.0.1:0", "--pprof"}},
		{Model: shards[1], Name: "hop1", Threads: 1, Args: []string{"--metrics-listen", "127.0.0.1:0"}},
		{Model: shards[1], Name: "hop1-standby", Threads: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// --pprof serves Go's profiles beside /metrics, and only where asked.
	for i, want := range []int{http.StatusOK, http.StatusNotFound} {
		resp, err := http.Get("http://" + c.Metrics[i] + "/debug/pprof/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want || (want == http.StatusOK && !strings.Contains(string(body), "serve")) {
			t.Fatalf("hop %d's /debug/pprof/cmdline: %d %.100q, want %d", i, resp.StatusCode, body, want)
		}
	}
	routeFlag := strings.Join(c.Addrs[:2], ",")
	keys := filepath.Join(dir, "keys")
	if err := os.WriteFile(keys, []byte("# test keys\nsk-test-1\nsk-test-2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	line := startLine(t, bin, "shardd api: listening on ", "api", "--route", routeFlag, "--tokenizer", shards[0],
		"--listen", "127.0.0.1:0", "--api-keys", keys, "--max-inflight", "1", "--max-queue", "1", "--model-id", "smollm2", "--step-timeout", "15s")
	base, _, _ := strings.Cut(line, " ")

	t.Run("openai", func(t *testing.T) {
		out, err := exec.Command(python, "../../api/testdata/openai_client.py", "--base", base+"/v1", "--key", "sk-test-2",
			"--model", "smollm2", "--workers-metrics", strings.Join(c.Metrics[:2], ",")).CombinedOutput()
		t.Logf("%s", out)
		if err != nil {
			t.Fatalf("the openai client's checks failed: %v", err)
		}
	})

	// Token for token: the API's greedy answer and generate's, on the
	// same route and prompt, as completions of token ids and as chat.
	tok, err := llamacpp.OpenTokenizer(shards[0])
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	ids, err := tok.Encode("Once upon a time, in a quiet village,")
	if err != nil {
		t.Fatal(err)
	}
	var idList []string
	for _, id := range ids {
		idList = append(idList, strconv.Itoa(int(id)))
	}
	want := generateTokens(t, bin, "--route", routeFlag, "--prompt-tokens", strings.Join(idList, ","), "--max-tokens", "24", "--verify-model", model)
	got := apiTokens(t, base+"/v1/completions", map[string]any{"prompt": ids, "max_tokens": 24, "temperature": 0, "ignore_eos": true})
	if !slices.Equal(got, want) {
		t.Errorf("completion tokens through the API %v, generate's %v", got, want)
	}
	q := "Name three primary colors."
	want = generateTokens(t, bin, "--route", routeFlag, "--chat", "--prompt", q, "--tokenizer", shards[0], "--max-tokens", "48", "--verify-model", model)
	got = apiTokens(t, base+"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": q}},
		"max_tokens": 48, "temperature": 0})
	if !slices.Equal(got, want) {
		t.Errorf("chat tokens through the API %v, generate's %v", got, want)
	}
	t.Logf("API and generate agree: %d completion tokens, %d chat tokens", 24, len(got))

	t.Run("bench --openai", func(t *testing.T) { benchOpenAI(t, bin, routeFlag, base) })
	t.Run("tls", func(t *testing.T) { apiTLS(t, bin, routeFlag, shards[0]) })

	// A worker that dies under streams of an API whose route has a
	// standby for it: every stream pauses and completes. Then, through
	// the API without one: /health says which hop, a request gets a 502
	// or 503 that names no address.
	standbyLine := startLine(t, bin, "shardd api: listening on ", "api", "--route", c.Addrs[0]+","+c.Addrs[1]+"|"+c.Addrs[2],
		"--tokenizer", shards[0], "--listen", "127.0.0.1:0")
	standbyBase, _, _ := strings.Cut(standbyLine, " ")
	// Kill waits until the worker is gone: under a loaded machine a
	// SIGKILLed process can still answer for a moment, and /health below
	// must see it dead.
	streamsSurvive(t, standbyBase, func() { c.Kill(1) })
	resp, err := http.Get(base + "/health")
	if err != nil {
		t.Fatal(err)
	}
	health, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(health), "hop 1") {
		t.Errorf("health with hop 1 dead: %d %s", resp.StatusCode, health)
	}
	req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(`{"prompt": "Hello", "max_tokens": 4}`))
	req.Header.Set("Authorization", "Bearer sk-test-1")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if (resp.StatusCode != 502 && resp.StatusCode != 503) || strings.Contains(string(body), "127.0.0.1") {
		t.Errorf("a request with hop 1 dead: %d %s", resp.StatusCode, body)
	}
}

// streamsSurvive runs 4 streamed completions through the API at base and
// calls kill once each has had 5 tokens: each must still end with all
// its tokens and finish_reason length.
func streamsSurvive(t *testing.T, base string, kill func()) {
	const streams, n = 4, 40
	var wg, started sync.WaitGroup
	started.Add(streams)
	errs := make([]error, streams)
	for k := range streams {
		wg.Go(func() {
			body := fmt.Sprintf(`{"prompt": "Story %d: once upon a time", "max_tokens": %d, "temperature": 0, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}`, k, n)
			resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs[k] = err
				started.Done()
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			chunks, finish, usage, once := 0, "", 0, sync.Once{}
			for sc.Scan() {
				data, ok := strings.CutPrefix(sc.Text(), "data: ")
				if !ok || data == "[DONE]" {
					continue
				}
				var ch struct {
					Choices []struct {
						Text         string  `json:"text"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
					Usage *struct {
						CompletionTokens int `json:"completion_tokens"`
					} `json:"usage"`
					Error any `json:"error"`
				}
				if json.Unmarshal([]byte(data), &ch) != nil || ch.Error != nil {
					errs[k] = fmt.Errorf("stream %d: %s", k, data)
					break
				}
				if ch.Usage != nil {
					usage = ch.Usage.CompletionTokens
				}
				for _, c := range ch.Choices {
					if c.Text != "" {
						if chunks++; chunks == 5 {
							once.Do(started.Done)
						}
					}
					if c.FinishReason != nil {
						finish = *c.FinishReason
					}
				}
			}
			once.Do(started.Done)
			if errs[k] == nil && (finish != "length" || usage != n) {
				errs[k] = fmt.Errorf("stream %d: finish %q, %d tokens", k, finish, usage)
			}
		})
	}
	started.Wait()
	kill()
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// benchOpenAI runs `shardd bench` with the route and the API over it as
// targets, interleaved: both generate every token, without errors.
func benchOpenAI(t *testing.T, bin, routeFlag, base string) {
	js := filepath.Join(t.TempDir(), "r.json")
	out, err := exec.Command(bin, "bench", "--route", routeFlag, "--compact-logits", "on", "--openai", "api="+base,
		"--api-key", "sk-test-1", "--requests", "4", "--concurrency", "2", "--warmup", "0", "--prompt-len", "8",
		"--output-len", "6", "--rounds", "2", "--quiet", "--json", js).CombinedOutput()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Target       string            `json:"target"`
			Errors       int               `json:"errors"`
			ErrorSamples map[string]string `json:"error_samples"`
			OutputTokens int               `json:"output_tokens"`
			Hops         []any             `json:"hops"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, r := range rep.Runs {
		targets = append(targets, r.Target)
		if r.Errors != 0 || r.OutputTokens != 24 || (r.Target == "api") != (len(r.Hops) == 0) {
			t.Errorf("run %+v: want 24 tokens, no errors, hops only for the route", r)
		}
	}
	if !slices.Equal(targets, []string{"route", "api", "route", "api"}) {
		t.Errorf("runs of %v, want route and api interleaved", targets)
	}
}

// apiTLS serves the API with serve's TLS flags: HTTPS with the CA works
// (HTTP/1.1, as Python clients speak it), plaintext does not.
func apiTLS(t *testing.T, bin, routeFlag, tokenizer string) {
	pki := tlstest.NewPKI(t, "api")
	cert, key := pki.Leaf("127.0.0.1", time.Now().Add(time.Hour), x509.ExtKeyUsageServerAuth)
	line := startLine(t, bin, "shardd api: listening on ", "api", "--route", routeFlag, "--tokenizer", tokenizer,
		"--listen", "127.0.0.1:0", "--tls-cert", cert, "--tls-key", key)
	base, _, _ := strings.Cut(line, " ")
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("listening on %q, want https", base)
	}
	pem, err := os.ReadFile(pki.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	resp, err := client.Get(base + "/v1/models")
	if err != nil {
		t.Fatalf("https: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Proto != "HTTP/1.1" {
		t.Errorf("https: %d over %s", resp.StatusCode, resp.Proto)
	}
	if resp, err := http.Get("http://" + strings.TrimPrefix(base, "https://") + "/v1/models"); err == nil && resp.StatusCode == 200 {
		t.Errorf("plaintext HTTP to the TLS listener answered 200")
	}
}

var tokensLine = regexp.MustCompile(`(?m)^tokens: \[([0-9 ]*)\]$`)

// generateTokens runs `shardd generate` with args (--verify-model among
// them) and returns the tokens it printed.
func generateTokens(t *testing.T, bin string, args ...string) []int32 {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"generate"}, args...)...).CombinedOutput()
	m := tokensLine.FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("generate: %v\n%s", err, out)
	}
	var toks []int32
	for _, f := range strings.Fields(string(m[1])) {
		v, _ := strconv.Atoi(f)
		toks = append(toks, int32(v))
	}
	return toks
}

// apiTokens posts a greedy request with return_token_ids and returns the
// generated token ids.
func apiTokens(t *testing.T, url string, body map[string]any) []int32 {
	t.Helper()
	body["return_token_ids"] = true
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", url, strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer sk-test-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Choices []struct {
			TokenIDs []int32 `json:"token_ids"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || len(out.Choices) != 1 {
		t.Fatalf("%s: status %d, %v", url, resp.StatusCode, err)
	}
	return out.Choices[0].TokenIDs
}

package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshnet/shardd/backend/llamacpp"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/route"
)

// fakeVocab: token i is the i-th piece; token 0 ends a generation; text
// encodes one token per byte (ids offset by 1000).
type fakeVocab struct{ pieces []string }

func (v fakeVocab) Piece(id int32) string {
	if int(id) < len(v.pieces) {
		return v.pieces[id]
	}
	return ""
}
func (v fakeVocab) EndOfGeneration(id int32) bool { return id == 0 }
func (v fakeVocab) HasChatTemplate() bool         { return true }
func (v fakeVocab) Chat(msgs []llamacpp.Message, _ string) (string, error) {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<" + m.Role + ">" + m.Content)
	}
	return b.String() + "<assistant>", nil
}
func (v fakeVocab) Encode(text string) ([]int32, error) {
	out := make([]int32, len(text))
	for i := range text {
		out[i] = 1000 + int32(text[i])
	}
	return out, nil
}

// fakeRoute generates tokens 1, 2, 3, ... (its pieces), as route.Generate
// does: emit, then Stop, until MaxTokens. hold, when set, blocks each
// generation before its first token until it is closed or ctx ends; fail
// ends generations with that error.
type fakeRoute struct {
	mu      sync.Mutex
	reqs    []route.Request
	hold    chan struct{}
	started chan struct{}
	fail    error
	ended   chan error // each generation's end, when set
}

func (f *fakeRoute) Generate(ctx context.Context, req route.Request, emit func(int32) error) (st route.Stats, err error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	defer func() {
		if f.ended != nil {
			f.ended <- err
		}
	}()
	if f.started != nil {
		f.started <- struct{}{}
	}
	if f.hold != nil {
		select {
		case <-f.hold:
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
	if f.fail != nil {
		return st, f.fail
	}
	for n := 0; n < req.MaxTokens; n++ {
		if ctx.Err() != nil {
			return st, ctx.Err()
		}
		tok := int32(n + 1)
		if len(req.Prompt) > 0 && req.Prompt[0] == 7 && n == 2 {
			tok = 0 // prompt [7 ...]: an end-of-generation token third
		}
		st.Tokens++
		if err := emit(tok); err != nil {
			return st, err
		}
		if req.Stop != nil && req.Stop(tok) {
			break
		}
	}
	return st, nil
}

func newTestServer(t *testing.T, cfg Config, f *fakeRoute) *httptest.Server {
	t.Helper()
	if cfg.Model == "" {
		cfg.Model = "m"
	}
	pieces := []string{"", "Hel", "lo", " wor", "ld", "!", " 晨"[:3], " 晨"[3:], "🌱"[:2], "🌱"[2:]}
	for len(pieces) < 64 {
		pieces = append(pieces, "x")
	}
	srv := httptest.NewServer(New(cfg, f, fakeVocab{pieces: pieces}))
	t.Cleanup(srv.Close)
	return srv
}

func post(t *testing.T, url, key, body string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

// Every kind of bad body is a 400 in OpenAI's error form that names its
// field, and the route is never asked.
func TestBadBodies(t *testing.T) {
	f := &fakeRoute{}
	srv := newTestServer(t, Config{MaxTokens: 100, Vocabulary: 2000}, f)
	msgs := `"messages":[{"role":"user","content":"hi"}]`
	cases := []struct {
		path, body, param string
	}{
		{"chat", `{"messages": [`, ""},
		{"chat", `[1]`, ""},
		{"chat", `{}`, "messages"},
		{"chat", `{"messages": []}`, "messages"},
		{"chat", `{` + msgs + `, "n": 2}`, "n"},
		{"chat", `{` + msgs + `, "frobnicate": 1}`, "frobnicate"},
		{"chat", `{` + msgs + `, "max_tokens": "many"}`, "max_tokens"},
		{"chat", `{` + msgs + `, "max_tokens": 0}`, "max_tokens"},
		{"chat", `{` + msgs + `, "max_tokens": 101}`, "max_tokens"},
		{"chat", `{` + msgs + `, "temperature": 3}`, "temperature"},
		{"chat", `{` + msgs + `, "top_p": 0}`, "top_p"},
		{"chat", `{` + msgs + `, "top_k": -2}`, "top_k"},
		{"chat", `{` + msgs + `, "stop": [""]}`, "stop"},
		{"chat", `{` + msgs + `, "stop": 3}`, "stop"},
		{"chat", `{` + msgs + `, "logprobs": true}`, "logprobs"},
		{"chat", `{` + msgs + `, "tools": [{"type": "function"}]}`, "tools"},
		{"chat", `{` + msgs + `, "stream_options": {"include_usage": true}}`, "stream_options"},
		{"chat", `{` + msgs + `, "stream": true, "stream_options": {"x": true}}`, "stream_options.x"},
		{"chat", `{` + msgs + `, "response_format": {"type": "json_object"}}`, "response_format"},
		{"chat", `{` + msgs + `, "min_tokens": 5, "max_tokens": 2}`, "min_tokens"},
		{"chat", `{"messages":[{"role":"tool","content":"x"}]}`, "messages[0].role"},
		{"chat", `{"messages":[{"role":"user"}]}`, "messages[0].content"},
		{"chat", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, "messages[0].content"},
		{"chat", `{"prompt": "x"}`, "prompt"},
		{"completions", `{}`, "prompt"},
		{"completions", `{"prompt": ""}`, "prompt"},
		{"completions", `{"prompt": ["a", "b"]}`, "prompt"},
		{"completions", `{"prompt": [1, -1]}`, "prompt"},
		{"completions", `{"prompt": [1, 99999]}`, "prompt"},
		{"completions", `{"prompt": {"a": 1}}`, "prompt"},
		{"completions", `{"prompt": "x", "best_of": 3}`, "best_of"},
		{"completions", `{"prompt": "x", "echo": true}`, "echo"},
		{"completions", `{"prompt": "x", "suffix": "y"}`, "suffix"},
		{"completions", `{"prompt": "x", "logprobs": 2}`, "logprobs"},
		{"completions", `{"prompt": "x", "messages": []}`, "messages"},
		{"completions", `{"prompt": "x", "max_completion_tokens": 3}`, "max_completion_tokens"},
	}
	for _, c := range cases {
		url := srv.URL + "/v1/completions"
		if c.path == "chat" {
			url = srv.URL + "/v1/chat/completions"
		}
		resp, out := post(t, url, "", c.body)
		e, _ := out["error"].(map[string]any)
		param, _ := e["param"].(string)
		if resp.StatusCode != 400 || e == nil || param != c.param || e["type"] != "invalid_request_error" || e["message"] == "" {
			t.Errorf("%s %s: %d %v, want 400 naming %q", c.path, c.body, resp.StatusCode, out, c.param)
		}
		if c.param != "" && !strings.Contains(fmt.Sprint(e["message"]), strings.Split(c.param, "[")[0]) {
			t.Errorf("%s %s: message %q does not name %q", c.path, c.body, e["message"], c.param)
		}
	}
	if len(f.reqs) != 0 {
		t.Errorf("bad bodies reached the route %d times", len(f.reqs))
	}
	// Neutral values of unsupported fields are accepted.
	resp, out := post(t, srv.URL+"/v1/chat/completions", "", `{`+msgs+`, "n": 1, "logprobs": false, "tools": [], "presence_penalty": 0, "user": "u", "max_tokens": 2}`)
	if resp.StatusCode != 200 {
		t.Errorf("neutral fields: %d %v", resp.StatusCode, out)
	}
}

// A body past the bound is 413; a wrong model is 404.
func TestBoundsAndModel(t *testing.T) {
	srv := newTestServer(t, Config{MaxBodyBytes: 100}, &fakeRoute{})
	resp, _ := post(t, srv.URL+"/v1/completions", "", `{"prompt": "`+strings.Repeat("a", 200)+`"}`)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("large body: %d", resp.StatusCode)
	}
	resp, out := post(t, srv.URL+"/v1/completions", "", `{"prompt": "a", "model": "other"}`)
	if resp.StatusCode != 404 || out["error"].(map[string]any)["code"] != "model_not_found" {
		t.Errorf("wrong model: %d %v", resp.StatusCode, out)
	}
}

// Keys: none or a wrong one is 401 (/health and /metrics stay open).
func TestKeys(t *testing.T) {
	srv := newTestServer(t, Config{Keys: []string{"k1", "k2"}}, &fakeRoute{})
	for _, key := range []string{"", "k3", "k1x"} {
		if resp, _ := post(t, srv.URL+"/v1/completions", key, `{"prompt": "a"}`); resp.StatusCode != 401 {
			t.Errorf("key %q: %d", key, resp.StatusCode)
		}
	}
	if resp, _ := post(t, srv.URL+"/v1/completions", "k2", `{"prompt": "a", "max_tokens": 1}`); resp.StatusCode != 200 {
		t.Errorf("key k2: %d", resp.StatusCode)
	}
	for _, p := range []string{"/health", "/metrics"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil || resp.StatusCode != 200 {
			t.Errorf("%s without a key: %v %v", p, resp.StatusCode, err)
		}
		resp.Body.Close()
	}
}

// Answers: text, finish reasons, usage, sampling defaults and stop rules.
func TestAnswers(t *testing.T) {
	f := &fakeRoute{}
	srv := newTestServer(t, Config{MaxTokens: 50}, f)
	resp, out := post(t, srv.URL+"/v1/completions", "", `{"prompt": "ab", "max_tokens": 5, "temperature": 0}`)
	c := out["choices"].([]any)[0].(map[string]any)
	if resp.StatusCode != 200 || c["text"] != "Hello world!" || c["finish_reason"] != "length" || out["object"] != "text_completion" {
		t.Fatalf("completion: %d %v", resp.StatusCode, out)
	}
	u := out["usage"].(map[string]any)
	if u["prompt_tokens"] != 2.0 || u["completion_tokens"] != 5.0 || u["total_tokens"] != 7.0 {
		t.Errorf("usage %v", u)
	}
	// A stop string across pieces: none of it sent, finish "stop".
	_, out = post(t, srv.URL+"/v1/completions", "", `{"prompt": "ab", "max_tokens": 9, "stop": ["o wo", "zz"]}`)
	if c := out["choices"].([]any)[0].(map[string]any); c["text"] != "Hell" || c["finish_reason"] != "stop" {
		t.Errorf("stop string: %v", out)
	}
	// An end-of-generation token ends the answer (finish "stop") unless
	// ignore_eos, or before min_tokens.
	for body, want := range map[string]string{
		`{"prompt": [7], "max_tokens": 6}`:                     "stop",
		`{"prompt": [7], "max_tokens": 6, "ignore_eos": true}`: "length",
		`{"prompt": [7], "max_tokens": 6, "min_tokens": 4}`:    "length",
	} {
		_, out := post(t, srv.URL+"/v1/completions", "", body)
		if c := out["choices"].([]any)[0].(map[string]any); c["finish_reason"] != want {
			t.Errorf("%s: %v, want finish %s", body, out, want)
		}
	}
	// Chat defaults: max_tokens is the server's bound; temperature 1 (the
	// OpenAI default), top_p off, a random seed.
	_, out = post(t, srv.URL+"/v1/chat/completions", "", `{"messages":[{"role":"developer","content":"s"},{"role":"user","content":[{"type":"text","text":"q"}]}]}`)
	if c := out["choices"].([]any)[0].(map[string]any); c["message"].(map[string]any)["role"] != "assistant" || out["object"] != "chat.completion" {
		t.Errorf("chat: %v", out)
	}
	last := f.reqs[len(f.reqs)-1]
	if last.MaxTokens != 50 || last.Sampling.Temperature != 1 || last.Sampling.TopP != 0 || len(last.Prompt) != len("<system>s<user>q<assistant>") {
		t.Errorf("chat request %+v", last)
	}
}

// sse reads a stream's data lines.
func sse(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// A chat stream: the role first, text deltas of whole characters, the
// finish reason, the usage chunk, [DONE]; the same text as unstreamed.
func TestChatStream(t *testing.T) {
	srv := newTestServer(t, Config{}, &fakeRoute{})
	body := `{"messages":[{"role":"user","content":"q"}],"max_tokens":9,"stream":true,"stream_options":{"include_usage":true}}`
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	lines := sse(t, resp.Body)
	if len(lines) < 4 || lines[len(lines)-1] != "[DONE]" {
		t.Fatalf("stream %q", lines)
	}
	var text strings.Builder
	var finish string
	var usage map[string]any
	for i, l := range lines[:len(lines)-1] {
		var c map[string]any
		if err := json.Unmarshal([]byte(l), &c); err != nil {
			t.Fatalf("chunk %q: %v", l, err)
		}
		if c["object"] != "chat.completion.chunk" {
			t.Errorf("chunk object %v", c["object"])
		}
		ch := c["choices"].([]any)
		if len(ch) == 0 {
			usage = c["usage"].(map[string]any)
			continue
		}
		delta := ch[0].(map[string]any)["delta"].(map[string]any)
		if (i == 0) != (delta["role"] == "assistant") {
			t.Errorf("chunk %d: delta %v", i, delta)
		}
		if s, _ := delta["content"].(string); strings.ContainsRune(s, '\uFFFD') {
			t.Errorf("chunk %d: a cut character %q", i, s)
		} else {
			text.WriteString(s)
		}
		if r, _ := ch[0].(map[string]any)["finish_reason"].(string); r != "" {
			finish = r
		}
	}
	if text.String() != "Hello world! 晨🌱" || finish != "length" || usage["completion_tokens"] != 9.0 {
		t.Errorf("text %q, finish %q, usage %v", text.String(), finish, usage)
	}
	_, out := post(t, srv.URL+"/v1/chat/completions", "", `{"messages":[{"role":"user","content":"q"}],"max_tokens":9}`)
	if got := out["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"]; got != text.String() {
		t.Errorf("unstreamed %q, streamed %q", got, text.String())
	}
}

// A full server: MaxInflight generations run, MaxQueue wait, the next is
// 429 with Retry-After; a queued client that leaves frees its place; a
// disconnected stream cancels its generation.
func TestAdmission(t *testing.T) {
	f := &fakeRoute{hold: make(chan struct{}), started: make(chan struct{}, 8), ended: make(chan error, 8)}
	srv := newTestServer(t, Config{MaxInflight: 1, MaxQueue: 1}, f)
	body := `{"prompt": "a", "max_tokens": 3}`
	results := make(chan int, 2)
	for range 2 {
		go func() {
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				results <- 0
				return
			}
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	<-f.started // one in flight
	waitMetric(t, srv.URL, "shardd_api_requests_queued 1")
	resp, out := post(t, srv.URL+"/v1/completions", "", body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || out["error"].(map[string]any)["type"] != "rate_limit_error" {
		t.Errorf("past the queue: %d %v %v", resp.StatusCode, resp.Header, out)
	}
	close(f.hold)
	for range 2 {
		if s := <-results; s != 200 {
			t.Errorf("held request: %d", s)
		}
	}
	for range 2 {
		<-f.ended
	}

	// A client that leaves mid-stream: its generation's context ends.
	f2 := &fakeRoute{hold: make(chan struct{}), started: make(chan struct{}, 1), ended: make(chan error, 1)}
	srv2 := newTestServer(t, Config{}, f2)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv2.URL+"/v1/completions", strings.NewReader(`{"prompt":"a","stream":true}`))
	go http.DefaultClient.Do(req)
	<-f2.started
	cancel()
	select {
	case err := <-f2.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("generation ended with %v, want its context cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the generation went on after its client left")
	}
	waitMetric(t, srv2.URL, `shardd_api_requests_total{endpoint="completions",status="499"} 1`)
}

// A client that sends its next request when one ends, as many at once as
// the server runs and queues, is never refused: a generation's slot is
// free before its answer's end is written (streamed or whole).
func TestAdmissionBackToBack(t *testing.T) {
	srv := newTestServer(t, Config{MaxInflight: 1, MaxQueue: 1}, &fakeRoute{})
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Go(func() {
			for i := range 500 {
				body := fmt.Sprintf(`{"prompt": "a", "max_tokens": 2, "stream": %v}`, (i+c)%2 == 0)
				resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					t.Errorf("client %d, request %d: %d", c, i, resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
}

// Failures: a worker's refusal is a 502/503 with a message that names no
// address, and a deadline is 504; requests after them are served.
func TestFailures(t *testing.T) {
	cases := []struct {
		err    error
		status int
	}{
		{&route.RefusedError{Addr: "10.0.0.7:7001", Code: shardv1.ErrorCode_ERROR_CODE_INTERNAL, Detail: "secret"}, 502},
		{&route.RefusedError{Addr: "10.0.0.7:7001", Code: shardv1.ErrorCode_ERROR_CODE_RESOURCE_EXHAUSTED, Retryable: true}, 503},
		{fmt.Errorf("%w: 10.0.0.7:7001 did not open", route.ErrUnreachable), 503},
		{fmt.Errorf("route: 10.0.0.7:7001: step failed: %w", io.ErrUnexpectedEOF), 502},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), 504},
	}
	for _, c := range cases {
		f := &fakeRoute{fail: c.err}
		srv := newTestServer(t, Config{}, f)
		resp, out := post(t, srv.URL+"/v1/completions", "", `{"prompt":"a"}`)
		msg := fmt.Sprint(out["error"].(map[string]any)["message"])
		if resp.StatusCode != c.status || strings.Contains(msg, "10.0.0.7") || strings.Contains(msg, "secret") {
			t.Errorf("%v: %d %q, want %d without the address", c.err, resp.StatusCode, msg, c.status)
		}
		f.fail = nil
		if resp, _ := post(t, srv.URL+"/v1/completions", "", `{"prompt":"a","max_tokens":1}`); resp.StatusCode != 200 {
			t.Errorf("after a failure: %d", resp.StatusCode)
		}
	}
	// The request deadline reaches the route.
	f := &fakeRoute{hold: make(chan struct{})}
	srv := newTestServer(t, Config{RequestTimeout: 50 * time.Millisecond}, f)
	if resp, _ := post(t, srv.URL+"/v1/completions", "", `{"prompt":"a"}`); resp.StatusCode != 504 {
		t.Errorf("deadline: %d", resp.StatusCode)
	}
}

func waitMetric(t *testing.T, base, line string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(base + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), line) {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no metric line %q", line)
}

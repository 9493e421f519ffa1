package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/meshnet/shardd/route"
)

// openAIClient drives an OpenAI-compatible server (shardd api,
// llama-server, vLLM, ...) as a harness target: each request is a
// streamed /v1/completions of the workload's token ids, asked to generate
// exactly max_tokens (ignore_eos, min_tokens), with the usage at the end.
//
// Token times: a streamed chunk that carries text is one token, timed
// when it arrives. A server may send one chunk for several tokens (a
// character spread over tokens is sent whole); the usage then counts
// more tokens than chunks, and the missing ones are timed with the last
// chunk (their gap is 0). The generated token ids come back where the
// server returns them (return_token_ids: shardd api, vLLM); elsewhere a
// conversation's history carries the workload's own filler ids in their
// place (filler counts that).
type openAIClient struct {
	base, key, model string
	http             *http.Client
	// vocab is the server's vocabulary as its /v1/models says (meta.n_vocab,
	// as llama-server and shardd api report it), or 0.
	vocab int
}

// newOpenAIClient reads the served model from base's /v1/models.
func newOpenAIClient(ctx context.Context, base, key string) (*openAIClient, error) {
	base = strings.TrimSuffix(strings.TrimSuffix(base, "/"), "/v1")
	c := &openAIClient{base: base, key: key, http: &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 1024, IdleConnTimeout: 2 * time.Second, DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext}}}
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/models", nil)
	c.auth(req)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("load: %s: %w", base, err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID   string `json:"id"`
			Meta struct {
				NVocab int `json:"n_vocab"`
			} `json:"meta"`
		} `json:"data"`
	}
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("load: %s/v1/models: HTTP %d", base, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) == 0 {
		return nil, fmt.Errorf("load: %s/v1/models lists no model", base)
	}
	c.model, c.vocab = list.Data[0].ID, list.Data[0].Meta.NVocab
	return c, nil
}

func (c *openAIClient) auth(r *http.Request) {
	if c.key != "" {
		r.Header.Set("Authorization", "Bearer "+c.key)
	}
}

// HTTPError is a non-200 answer of an OpenAI-compatible server.
type HTTPError struct {
	Status int
	Body   string
}

func (e *HTTPError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, e.Body) }

// Generate runs req as one streamed completion; emit is called per token
// as route.Generate calls it (see openAIClient on token times and ids).
func (c *openAIClient) Generate(ctx context.Context, req route.Request, emit func(int32) error) (route.Stats, error) {
	st := route.Stats{PromptTokens: len(req.Prompt)}
	body := map[string]any{"model": c.model, "prompt": req.Prompt, "max_tokens": req.MaxTokens, "min_tokens": req.MaxTokens,
		"ignore_eos": true, "stream": true, "stream_options": map[string]any{"include_usage": true},
		"temperature": req.Sampling.Temperature, "seed": int64(req.Sampling.Seed >> 1), "return_token_ids": true}
	if req.Sampling.TopK > 0 {
		body["top_k"] = req.Sampling.TopK
	}
	if req.Sampling.TopP > 0 {
		body["top_p"] = req.Sampling.TopP
	}
	b, _ := json.Marshal(body)
	hr, _ := http.NewRequestWithContext(ctx, "POST", c.base+"/v1/completions", bytes.NewReader(b))
	hr.Header.Set("Content-Type", "application/json")
	// A kept-alive connection the server closed as the request went out
	// (llama-server keeps idle ones 5 s) fails before the server read it:
	// the key lets Go's transport send it again on a fresh connection.
	// Idle connections are dropped after 2 s for the same reason.
	hr.Header.Set("X-Idempotency-Key", fmt.Sprint(time.Now().UnixNano()))
	c.auth(hr)
	start := time.Now()
	resp, err := c.http.Do(hr)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return st, &HTTPError{Status: resp.StatusCode, Body: strings.TrimSpace(string(msg))}
	}
	var usage, got int
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			break
		}
		var ch struct {
			Choices []struct {
				Text     string  `json:"text"`
				TokenIDs []int32 `json:"token_ids"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			return st, fmt.Errorf("load: a stream chunk that is not JSON: %w", err)
		}
		if ch.Error != nil {
			return st, fmt.Errorf("load: the server ended the stream: %s", ch.Error.Message)
		}
		if ch.Usage != nil {
			usage = ch.Usage.CompletionTokens
		}
		for _, choice := range ch.Choices {
			toks := choice.TokenIDs
			if len(toks) == 0 && choice.Text != "" {
				toks = filler // a token whose id the server does not say
			}
			for _, t := range toks {
				if got == 0 {
					st.Prefill = time.Since(start)
				}
				got++
				if err := emit(t); err != nil {
					return st, err
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return st, err
	}
	// Tokens the server counted but sent in a chunk with others (or with
	// no text), without their ids: timed now.
	for ; got < usage; got++ {
		if err := emit(filler[0]); err != nil {
			return st, err
		}
	}
	st.Tokens = got
	if got == 0 {
		return st, errors.New("load: the server generated nothing")
	}
	st.Decode = time.Since(start) - st.Prefill
	return st, nil
}

// filler stands for a generated token whose id the server does not
// return.
var filler = []int32{1}

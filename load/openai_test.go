package load

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/meshnet/shardd/route"
)

// A server like llama-server: no token ids, and one chunk for two tokens
// (a character spread over them). Every token the usage counts is
// emitted, the ids as fillers; the request carries what makes any server
// generate exactly max_tokens.
func TestOpenAIClientCounts(t *testing.T) {
	var asked map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"m","meta":{"n_vocab":77}}]}`)
			return
		}
		if r.Header.Get("Authorization") != "Bearer k" {
			http.Error(w, `{"error":{"message":"no key"}}`, 401)
			return
		}
		json.NewDecoder(r.Body).Decode(&asked)
		w.Header().Set("Content-Type", "text/event-stream")
		for _, text := range []string{"a", "", "晨", "b"} {
			fmt.Fprintf(w, "data: {\"choices\":[{\"text\":%q}]}\n\n", text)
		}
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":5}}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	c, err := newOpenAIClient(context.Background(), srv.URL+"/v1", "k")
	if err != nil {
		t.Fatal(err)
	}
	if c.model != "m" || c.vocab != 77 {
		t.Errorf("model %q, vocab %d", c.model, c.vocab)
	}
	var got []int32
	st, err := c.Generate(context.Background(), route.Request{Prompt: []int32{3, 4}, MaxTokens: 5, Sampling: route.Sampling{TopK: 2}},
		func(tok int32) error { got = append(got, tok); return nil })
	if err != nil || st.Tokens != 5 || !slices.Equal(got, []int32{1, 1, 1, 1, 1}) {
		t.Errorf("tokens %v, stats %+v, err %v", got, st, err)
	}
	for k, v := range map[string]any{"max_tokens": 5.0, "min_tokens": 5.0, "ignore_eos": true, "stream": true, "top_k": 2.0} {
		if asked[k] != v {
			t.Errorf("request field %s = %v, want %v", k, asked[k], v)
		}
	}
	if p, _ := asked["prompt"].([]any); len(p) != 2 {
		t.Errorf("prompt %v, want the token ids", asked["prompt"])
	}
	c.key = "wrong"
	_, err = c.Generate(context.Background(), route.Request{Prompt: []int32{3}, MaxTokens: 1}, func(int32) error { return nil })
	if errorClass(err) != "HTTP_401" {
		t.Errorf("a refused request: %v (%s)", err, errorClass(err))
	}
}

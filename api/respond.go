package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"
)

// answer is one request's response as it is generated: streamed chunk by
// chunk (stream) or gathered for one JSON body.
type answer struct {
	s              *Server
	w              http.ResponseWriter
	isChat, stream bool
	usage          bool // stream_options.include_usage
	id             string
	created        int64
	arrival, last  time.Time
	text           textOut
	whole          strings.Builder // the text, when not streaming
	promptTokens   int
	tokens         int
	// ids are the generated tokens, kept when the request asked for them.
	ids     []int32
	keepIDs bool
	// sentIDs counts the ids already streamed: each chunk carries the
	// tokens since the last one (vLLM's return_token_ids in a stream).
	sentIDs int
	// started: the stream's headers (and, for chat, the role chunk) are
	// sent; from then on a failure can only be told in the stream.
	started bool
	// ended: the answer reached an end-of-generation token.
	ended bool
}

// emit takes one generated token (route.Generate's callback).
func (a *answer) emit(tok int32) error {
	now := time.Now()
	if a.tokens == 0 {
		a.s.m.ttft.Observe(now.Sub(a.arrival).Seconds())
	} else {
		a.s.m.itl.Observe(now.Sub(a.last).Seconds())
	}
	a.last = now
	a.tokens++
	if a.keepIDs {
		a.ids = append(a.ids, tok)
	}
	if a.s.vocab.EndOfGeneration(tok) {
		return nil // control tokens have no text (ignore_eos, min_tokens)
	}
	piece, stopped := a.text.add(a.s.vocab.Piece(tok))
	if err := a.send(piece); err != nil {
		return err
	}
	if stopped {
		return errStopString
	}
	return nil
}

// send passes text on: a chunk when streaming (none for empty text), else
// into the whole answer.
func (a *answer) send(text string) error {
	if !a.stream {
		a.whole.WriteString(text)
		return nil
	}
	if text == "" {
		return nil
	}
	return a.chunk(text, nil)
}

// finish ends a generation that succeeded: the held text, then the
// finish reason ("stop" at an end-of-generation token or stop string,
// else "length") and the usage.
func (a *answer) finish(stopped bool) {
	if !a.text.stopped {
		a.send(a.text.flush())
	}
	reason := "length"
	if stopped {
		reason = "stop"
	}
	usage := map[string]int{"prompt_tokens": a.promptTokens, "completion_tokens": a.tokens,
		"total_tokens": a.promptTokens + a.tokens}
	if a.stream {
		a.chunk("", &reason)
		if a.usage {
			a.event(a.envelope(a.chunkObject(), []any{}, usage))
		}
		a.w.Write([]byte("data: [DONE]\n\n"))
		a.flush()
		return
	}
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": reason}
	if a.keepIDs {
		choice["token_ids"] = append([]int32{}, a.ids...)
	}
	if a.isChat {
		choice["message"] = map[string]any{"role": "assistant", "content": a.whole.String()}
	} else {
		choice["text"] = a.whole.String()
	}
	obj := "text_completion"
	if a.isChat {
		obj = "chat.completion"
	}
	writeJSON(a.w, http.StatusOK, a.envelope(obj, []any{choice}, usage))
}

// fail tells the client a generation failed: an error body when nothing
// was sent yet, else an error event that ends the stream.
func (a *answer) fail(status int, typ, code, msg string) {
	if !a.started {
		writeError(a.w, status, typ, code, "", msg)
		return
	}
	a.event(errorBody(typ, code, "", msg))
	a.flush()
}

// chunk sends one streamed chunk: text, or (reason set) the finish.
func (a *answer) chunk(text string, reason *string) error {
	if !a.started {
		a.start()
	}
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": nil}
	if reason != nil {
		choice["finish_reason"] = *reason
	}
	if a.keepIDs {
		choice["token_ids"] = a.ids[a.sentIDs:]
		a.sentIDs = len(a.ids)
	}
	switch {
	case a.isChat && reason != nil:
		choice["delta"] = map[string]any{}
	case a.isChat:
		choice["delta"] = map[string]any{"content": text}
	default:
		choice["text"] = text
	}
	return a.event(a.envelope(a.chunkObject(), []any{choice}, nil))
}

// start sends the stream's headers and, for chat, the first chunk: the
// assistant's role.
func (a *answer) start() {
	a.started = true
	h := a.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	a.w.WriteHeader(http.StatusOK)
	if a.isChat {
		choice := map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}
		a.event(a.envelope(a.chunkObject(), []any{choice}, nil))
	}
}

func (a *answer) chunkObject() string {
	if a.isChat {
		return "chat.completion.chunk"
	}
	return "text_completion"
}

// envelope is a response object around choices; usage nil is left out
// (streamed chunks carry "usage": null, as OpenAI's do, when usage was
// asked for).
func (a *answer) envelope(object string, choices []any, usage map[string]int) map[string]any {
	e := map[string]any{"id": a.id, "object": object, "created": a.created, "model": a.s.cfg.Model, "choices": choices}
	switch {
	case usage != nil:
		e["usage"] = usage
	case a.stream && a.usage:
		e["usage"] = nil
	}
	return e
}

// event writes one SSE data line and flushes it to the client.
func (a *answer) event(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(append(append(buf, "data: "...), b...), "\n\n"...)
	if _, err := a.w.Write(buf); err != nil {
		return errClientGone // the generation ends
	}
	a.flush()
	return nil
}

func (a *answer) flush() {
	if f, ok := a.w.(http.Flusher); ok {
		f.Flush()
	}
}

// writeJSON writes v as the response body with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeError writes OpenAI's error body.
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string) {
	writeJSON(w, status, errorBody(typ, code, param, msg))
}

func errorBody(typ, code, param, msg string) map[string]any {
	e := map[string]any{"message": msg, "type": typ, "code": code, "param": nil}
	if param != "" {
		e["param"] = param
	}
	return map[string]any{"error": e}
}

// clip bounds a client's string quoted back in an error.
func clip(s string) string {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

// sanitize is an error as a client may see it: its first line, bounded.
func sanitize(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return clip(s)
}

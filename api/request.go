package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/meshnet/shardd/backend/llamacpp"
)

// genRequest is a parsed completions or chat request: what the route is
// asked for, whatever the endpoint.
type genRequest struct {
	chat      bool
	model     string
	text      string  // the prompt as text (completions)
	ids       []int32 // the prompt as token ids (completions)
	messages  []llamacpp.Message
	maxTokens int // 0: not given
	// temperature: the OpenAI default is 1.
	temperature float64
	topP        float64 // 1: off
	topK        int     // 0: off
	seed        *uint64
	stops       []string
	ignoreEOS   bool
	minTokens   int
	stream      bool
	usage       bool // stream_options.include_usage
	// tokenIDs: return the generated token ids (vLLM's return_token_ids
	// extension), in the choice or, streamed, in the finishing chunk.
	tokenIDs bool
}

// fieldError is a request the API refuses: a 400 that names the field.
type fieldError struct {
	param, msg string
	code       string // "invalid_value", "unsupported_parameter", ...
}

func (e *fieldError) Error() string { return e.msg }

func bad(param, format string, args ...any) *fieldError {
	return &fieldError{param: param, msg: fmt.Sprintf(format, args...), code: "invalid_value"}
}

func unsupported(param, why string) *fieldError {
	return &fieldError{param: param, code: "unsupported_parameter",
		msg: fmt.Sprintf("'%s' is not supported by this server: %s", param, why)}
}

// neutral are fields a client may send at their default value (which
// changes nothing) but no other: each says why another value is refused.
var neutral = map[string]struct {
	ok  func(json.RawMessage) bool
	why string
}{
	"n":                   {isOne, "one choice per request (n = 1)"},
	"best_of":             {isOne, "one choice per request (best_of = 1)"},
	"echo":                {isFalse, "the prompt is not echoed"},
	"logprobs":            {isFalseOrZero, "log probabilities are not returned"},
	"top_logprobs":        {isZero, "log probabilities are not returned"},
	"suffix":              {isEmptyString, "no insertion (suffix)"},
	"presence_penalty":    {isZero, "no penalties"},
	"frequency_penalty":   {isZero, "no penalties"},
	"repetition_penalty":  {isOneFloat, "no penalties"},
	"logit_bias":          {isEmptyObject, "no logit bias"},
	"tools":               {isEmptyArray, "no tool calls"},
	"tool_choice":         {isNone, "no tool calls"},
	"functions":           {isEmptyArray, "no function calls"},
	"function_call":       {isNone, "no function calls"},
	"parallel_tool_calls": {isAny, ""},
	"response_format":     {isTextFormat, "plain text only (response_format type text)"},
}

// ignored are fields that change nothing about the answer.
var ignored = []string{"user", "metadata", "store", "service_tier"}

// parseRequest reads a completions (chat false) or chat completions body.
// Unknown fields and fields this server cannot honour are refused,
// each naming itself.
func parseRequest(body []byte, chat bool) (*genRequest, *fieldError) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, &fieldError{msg: "the body is not a JSON object: " + jsonProblem(err), code: "invalid_json"}
	}
	r := &genRequest{chat: chat, temperature: 1, topP: 1}
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys) // the first bad field named is the same every time
	for _, k := range keys {
		v := raw[k]
		if isNull(v) {
			continue
		}
		if err := r.field(k, v); err != nil {
			return nil, err
		}
	}
	switch {
	case chat && len(r.messages) == 0:
		return nil, bad("messages", "'messages' is required: a non-empty list")
	case !chat && r.text == "" && len(r.ids) == 0:
		return nil, bad("prompt", "'prompt' is required: a non-empty string or list of token ids")
	case r.usage && !r.stream:
		return nil, bad("stream_options", "'stream_options' is only allowed with 'stream': true")
	case r.maxTokens > 0 && r.minTokens > r.maxTokens:
		return nil, bad("min_tokens", "'min_tokens' (%d) is more than 'max_tokens' (%d)", r.minTokens, r.maxTokens)
	}
	return r, nil
}

// field reads one top-level field.
func (r *genRequest) field(k string, v json.RawMessage) *fieldError {
	switch k {
	case "model":
		return decode(k, v, &r.model)
	case "prompt":
		if r.chat {
			return unknown(k)
		}
		return r.prompt(v)
	case "messages":
		if !r.chat {
			return unknown(k)
		}
		return r.parseMessages(v)
	case "max_tokens", "max_completion_tokens":
		if k == "max_completion_tokens" && !r.chat {
			return unknown(k)
		}
		if err := decode(k, v, &r.maxTokens); err != nil {
			return err
		}
		if r.maxTokens < 1 {
			return bad(k, "'%s' must be at least 1", k)
		}
	case "temperature":
		if err := decode(k, v, &r.temperature); err != nil {
			return err
		}
		if r.temperature < 0 || r.temperature > 2 || math.IsNaN(r.temperature) {
			return bad(k, "'temperature' must be between 0 and 2")
		}
	case "top_p":
		if err := decode(k, v, &r.topP); err != nil {
			return err
		}
		if !(r.topP > 0 && r.topP <= 1) {
			return bad(k, "'top_p' must be in (0, 1]")
		}
	case "top_k":
		if err := decode(k, v, &r.topK); err != nil {
			return err
		}
		if r.topK < -1 {
			return bad(k, "'top_k' must be -1 or 0 (off) or a positive number of tokens")
		}
		r.topK = max(r.topK, 0)
	case "seed":
		var s int64
		if err := decode(k, v, &s); err != nil {
			return err
		}
		u := uint64(s)
		r.seed = &u
	case "stop":
		return r.parseStop(v)
	case "ignore_eos":
		return decode(k, v, &r.ignoreEOS)
	case "min_tokens":
		if err := decode(k, v, &r.minTokens); err != nil {
			return err
		}
		if r.minTokens < 0 {
			return bad(k, "'min_tokens' must not be negative")
		}
	case "stream":
		return decode(k, v, &r.stream)
	case "return_token_ids":
		return decode(k, v, &r.tokenIDs)
	case "stream_options":
		var so map[string]json.RawMessage
		if err := decode(k, v, &so); err != nil {
			return err
		}
		for sk, sv := range so {
			if sk != "include_usage" {
				return unknown("stream_options." + sk)
			}
			if err := decode("stream_options.include_usage", sv, &r.usage); err != nil {
				return err
			}
		}
	default:
		if n, ok := neutral[k]; ok {
			if !n.ok(v) {
				return unsupported(k, n.why)
			}
			return nil
		}
		if slices.Contains(ignored, k) {
			return nil
		}
		return unknown(k)
	}
	return nil
}

func unknown(k string) *fieldError {
	return &fieldError{param: k, code: "unknown_parameter", msg: fmt.Sprintf("unrecognized request argument supplied: %s", k)}
}

// prompt reads a completions prompt: a string, a list of token ids, or a
// list of one of either (a batch of more is refused: one choice per
// request).
func (r *genRequest) prompt(v json.RawMessage) *fieldError {
	var s string
	if json.Unmarshal(v, &s) == nil {
		if s == "" {
			return bad("prompt", "'prompt' is empty")
		}
		r.text = s
		return nil
	}
	var ids []int64
	if json.Unmarshal(v, &ids) == nil {
		return r.promptIDs(ids)
	}
	var batch []json.RawMessage
	if json.Unmarshal(v, &batch) == nil {
		if len(batch) != 1 {
			return unsupported("prompt", fmt.Sprintf("one prompt per request, not a batch of %d", len(batch)))
		}
		if json.Unmarshal(batch[0], &s) == nil {
			return r.prompt(batch[0])
		}
		if json.Unmarshal(batch[0], &ids) == nil {
			return r.promptIDs(ids)
		}
	}
	return bad("prompt", "'prompt' must be a string or a list of token ids")
}

func (r *genRequest) promptIDs(ids []int64) *fieldError {
	if len(ids) == 0 {
		return bad("prompt", "'prompt' is an empty list of token ids")
	}
	r.ids = make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > math.MaxInt32 {
			return bad("prompt", "'prompt' token id %d is out of range", id)
		}
		r.ids[i] = int32(id)
	}
	return nil
}

// parseStop reads a stop string or a list of up to 16.
func (r *genRequest) parseStop(v json.RawMessage) *fieldError {
	var one string
	if json.Unmarshal(v, &one) == nil {
		r.stops = []string{one}
	} else if err := decode("stop", v, &r.stops); err != nil {
		return bad("stop", "'stop' must be a string or a list of strings")
	}
	if len(r.stops) > 16 {
		return bad("stop", "'stop' has %d strings; at most 16", len(r.stops))
	}
	for _, s := range r.stops {
		if s == "" {
			return bad("stop", "'stop' holds an empty string")
		}
	}
	return nil
}

// parseMessages reads chat messages: roles system (or developer), user
// and assistant; content a string or a list of text parts.
func (r *genRequest) parseMessages(v json.RawMessage) *fieldError {
	var msgs []map[string]json.RawMessage
	if err := decode("messages", v, &msgs); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return bad("messages", "'messages' is empty")
	}
	for i, m := range msgs {
		p := fmt.Sprintf("messages[%d]", i)
		var role string
		if err := decode(p+".role", m["role"], &role); err != nil {
			return err
		}
		switch role {
		case "developer":
			role = "system"
		case "system", "user", "assistant":
		default:
			return unsupported(p+".role", fmt.Sprintf("roles system, developer, user and assistant (not %.32q)", role))
		}
		var content string
		if err := messageContent(p+".content", m["content"], &content); err != nil {
			return err
		}
		for k, fv := range m {
			switch {
			case k == "role" || k == "content":
			case k == "name" || isNull(fv):
			default:
				return unsupported(p+"."+k, "messages carry a role and text content only")
			}
		}
		r.messages = append(r.messages, llamacpp.Message{Role: role, Content: content})
	}
	return nil
}

// messageContent reads a message's content: a string, or a list of parts
// of type text (joined).
func messageContent(p string, v json.RawMessage, out *string) *fieldError {
	if v == nil || isNull(v) {
		return bad(p, "'%s' is required", p)
	}
	if json.Unmarshal(v, out) == nil {
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(v, &parts) != nil {
		return bad(p, "'%s' must be a string or a list of text parts", p)
	}
	var b strings.Builder
	for _, part := range parts {
		if part.Type != "text" {
			return unsupported(p, fmt.Sprintf("text parts only (not %.32q)", part.Type))
		}
		b.WriteString(part.Text)
	}
	*out = b.String()
	return nil
}

// decode reads v into out, refusing a value of the wrong type with a 400
// naming the field.
func decode(param string, v json.RawMessage, out any) *fieldError {
	if v == nil {
		return bad(param, "'%s' is required", param)
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if err := dec.Decode(out); err != nil {
		return bad(param, "'%s' has the wrong type: %s", param, jsonProblem(err))
	}
	return nil
}

// jsonProblem describes a JSON error without echoing the body.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case asErr(err, &te):
		return "expected " + te.Type.String() + ", got " + te.Value
	case asErr(err, &se):
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	}
	return "invalid JSON"
}

func isNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

func isAny(json.RawMessage) bool { return true }

func isOne(v json.RawMessage) bool {
	var n float64
	return json.Unmarshal(v, &n) == nil && n == 1
}

func isOneFloat(v json.RawMessage) bool { return isOne(v) }

func isZero(v json.RawMessage) bool {
	var n float64
	return json.Unmarshal(v, &n) == nil && n == 0
}

func isFalse(v json.RawMessage) bool {
	var b bool
	return json.Unmarshal(v, &b) == nil && !b
}

func isFalseOrZero(v json.RawMessage) bool { return isFalse(v) || isZero(v) }

func isEmptyString(v json.RawMessage) bool {
	var s string
	return json.Unmarshal(v, &s) == nil && s == ""
}

func isEmptyObject(v json.RawMessage) bool {
	var m map[string]any
	return json.Unmarshal(v, &m) == nil && len(m) == 0
}

func isEmptyArray(v json.RawMessage) bool {
	var a []any
	return json.Unmarshal(v, &a) == nil && len(a) == 0
}

func isNone(v json.RawMessage) bool {
	var s string
	return json.Unmarshal(v, &s) == nil && s == "none"
}

func isTextFormat(v json.RawMessage) bool {
	var f struct {
		Type string `json:"type"`
	}
	return json.Unmarshal(v, &f) == nil && f.Type == "text"
}

func asErr[T error](err error, target *T) bool { return errors.As(err, target) }

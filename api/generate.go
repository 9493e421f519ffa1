package api

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/meshnet/shardd/internal/chat"
	"github.com/meshnet/shardd/route"
)

// completionDefault is a completion's max_tokens when it gives none
// (OpenAI's documented default).
const completionDefault = 16

// statusClientGone is what the metrics record for a request whose client
// left before the answer (nginx's convention; never sent).
const statusClientGone = 499

// generate serves /v1/completions (chat false) and /v1/chat/completions.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, isChat bool) {
	arrival := time.Now()
	endpoint := "completions"
	if isChat {
		endpoint = "chat_completions"
	}
	fail := func(status int, typ, code, param, msg string) {
		s.m.request(endpoint, status)
		writeError(w, status, typ, code, param, msg)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			fail(http.StatusRequestEntityTooLarge, "invalid_request_error", "body_too_large", "",
				fmt.Sprintf("the request body is larger than %d bytes", s.cfg.MaxBodyBytes))
			return
		}
		fail(http.StatusBadRequest, "invalid_request_error", "invalid_body", "", "the request body could not be read")
		return
	}
	req, ferr := parseRequest(body, isChat)
	if ferr == nil {
		ferr = s.checkLimits(req)
	}
	if ferr != nil {
		fail(http.StatusBadRequest, "invalid_request_error", ferr.code, ferr.param, ferr.msg)
		return
	}
	if req.model != "" && req.model != s.cfg.Model {
		fail(http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			"the model '"+clip(req.model)+"' does not exist; this server serves '"+s.cfg.Model+"'")
		return
	}
	ids, plain, ferr := s.promptOf(req)
	if ferr != nil {
		fail(http.StatusBadRequest, "invalid_request_error", ferr.code, ferr.param, ferr.msg)
		return
	}
	ctx := r.Context()
	if s.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.RequestTimeout)
		defer cancel()
	}
	release, full, err := s.admit(ctx)
	switch {
	case full:
		w.Header().Set("Retry-After", "1")
		fail(http.StatusTooManyRequests, "rate_limit_error", "queue_full", "",
			fmt.Sprintf("the server is at its limit (%d requests in flight, %d queued); retry later", s.cfg.MaxInflight, s.cfg.MaxQueue))
		return
	case err != nil && r.Context().Err() != nil:
		s.m.request(endpoint, statusClientGone)
		return
	case err != nil:
		fail(http.StatusGatewayTimeout, "timeout_error", "timeout", "", "the request's deadline passed while it was queued")
		return
	}
	release = sync.OnceFunc(release)
	defer release()
	s.m.promptTokens.Add(float64(len(ids)))

	a := &answer{s: s, w: w, isChat: isChat, stream: req.stream, usage: req.usage, arrival: arrival,
		id: newID(map[bool]string{false: "cmpl-", true: "chatcmpl-"}[isChat]), created: arrival.Unix(),
		text: textOut{stops: req.stops}, promptTokens: len(ids), keepIDs: req.tokenIDs}
	rq := s.routeRequest(req, ids, plain, &a.ended)
	st, err := s.gen.Generate(ctx, rq, a.emit)
	// The generation is over: its slot is free before the client can see
	// the answer's end, so a client that keeps MaxInflight + MaxQueue
	// requests going, each sent when the one before it ended, is never
	// refused.
	release()
	switch {
	case err == nil || errors.Is(err, errStopString):
		a.finish(a.ended || errors.Is(err, errStopString))
		s.m.request(endpoint, http.StatusOK)
	case r.Context().Err() != nil || errors.Is(err, errClientGone):
		// The client left: the route has cancelled and released the
		// session on every worker.
		s.m.request(endpoint, statusClientGone)
	default:
		status, typ, code, msg := classify(err, ctx)
		slog.Warn("api: generation failed", "endpoint", endpoint, "id", a.id, "status", status, "err", err)
		s.m.request(endpoint, status)
		a.fail(status, typ, code, msg)
	}
	s.m.completionTokens.Add(float64(st.Tokens))
}

// checkLimits refuses what the server's own bounds do not allow.
func (s *Server) checkLimits(req *genRequest) *fieldError {
	if req.maxTokens > s.cfg.MaxTokens {
		return bad("max_tokens", "'max_tokens' is %d; this server allows at most %d", req.maxTokens, s.cfg.MaxTokens)
	}
	return nil
}

// promptOf is the request's prompt as token ids: a completion's text
// tokenized, its ids checked against the vocabulary, or chat messages
// rendered with the model's template (plain: as a transcript, for a model
// without one).
func (s *Server) promptOf(req *genRequest) (ids []int32, plain bool, ferr *fieldError) {
	s.tokMu.Lock()
	defer s.tokMu.Unlock()
	text := req.text
	switch {
	case req.chat:
		var err error
		if text, plain, err = chat.Render(s.vocab, req.messages, s.cfg.ChatTemplate); err != nil {
			return nil, false, bad("messages", "the messages could not be rendered with the model's chat template")
		}
	case len(req.ids) > 0:
		for _, id := range req.ids {
			if s.cfg.Vocabulary > 0 && int(id) >= s.cfg.Vocabulary {
				return nil, false, bad("prompt", "'prompt' token id %d is not below the vocabulary's %d", id, s.cfg.Vocabulary)
			}
		}
		return req.ids, false, nil
	}
	ids, err := s.vocab.Encode(text)
	if err != nil || len(ids) == 0 {
		return nil, false, bad("prompt", "the prompt could not be tokenized")
	}
	return ids, plain, nil
}

// routeRequest is the generation the route runs for req; ended is set
// when the answer ends before max_tokens (an end-of-generation token).
func (s *Server) routeRequest(req *genRequest, ids []int32, plain bool, ended *bool) route.Request {
	max := req.maxTokens
	if max == 0 {
		max = completionDefault
		if req.chat {
			max = s.cfg.MaxTokens
		}
	}
	smp := route.Sampling{Temperature: req.temperature, TopK: req.topK}
	if req.topP < 1 {
		smp.TopP = req.topP
	}
	if req.seed != nil {
		smp.Seed = *req.seed
	} else {
		var b [8]byte
		rand.Read(b[:])
		smp.Seed = binary.LittleEndian.Uint64(b[:])
	}
	answerEnd := chat.Stopper(s.vocab, plain)
	n := 0
	stop := func(tok int32) bool {
		n++
		if req.ignoreEOS || n <= req.minTokens {
			return false
		}
		*ended = answerEnd(tok)
		return *ended
	}
	return route.Request{Prompt: ids, MaxTokens: max, Sampling: smp, Stop: stop}
}

// classify maps a generation's failure to what the client is told: the
// status, the error's type and code, and a message without the route's
// addresses or the workers' own words (those go to the log).
func classify(err error, ctx context.Context) (status int, typ, code, msg string) {
	var re *route.RefusedError
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timeout_error", "timeout", "the request's deadline passed before the answer was complete"
	case errors.As(err, &re) && re.Retryable:
		return http.StatusServiceUnavailable, "server_error", "overloaded", fmt.Sprintf("a worker of the route is full (%s); retry later", re.Code)
	case errors.Is(err, route.ErrUnreachable):
		return http.StatusServiceUnavailable, "server_error", "worker_unreachable", "a worker of the route is unreachable"
	case errors.As(err, &re):
		return http.StatusBadGateway, "server_error", "worker_refused", fmt.Sprintf("a worker of the route refused the work (%s)", re.Code)
	case errors.Is(err, route.ErrResponse):
		return http.StatusBadGateway, "server_error", "bad_worker_response", "a worker of the route returned an unusable response"
	case errors.Is(err, route.ErrStateLost), errors.Is(err, route.ErrRecipeChanged), errors.Is(err, route.ErrRoute):
		return http.StatusBadGateway, "server_error", "route_failed", "the route lost the generation's state"
	}
	return http.StatusBadGateway, "server_error", "worker_failed", "a worker of the route failed"
}

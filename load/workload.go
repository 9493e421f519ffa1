package load

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/meshnet/shardd/route"
)

// ErrInput is a workload, length file or budget the harness cannot use.
var ErrInput = errors.New("load: bad input")

// Lengths draws a request's prompt and output lengths.
type Lengths struct {
	// Prompt and Output are inclusive ranges; Min == Max is a fixed length.
	Prompt, Output [2]int
	// Pairs, when set, replaces the ranges: request i takes a pair drawn
	// from it with the workload's seed.
	Pairs [][2]int
}

// ParseRange reads "N" or "MIN-MAX" (both >= 1).
func ParseRange(s string) ([2]int, error) {
	lo, hi, isRange := strings.Cut(strings.TrimSpace(s), "-")
	a, err := strconv.Atoi(lo)
	b := a
	if err == nil && isRange {
		b, err = strconv.Atoi(hi)
	}
	if err != nil || a < 1 || b < a {
		return [2]int{}, fmt.Errorf("%w: length %q: want N or MIN-MAX, positive", ErrInput, s)
	}
	return [2]int{a, b}, nil
}

// ReadLengthFile reads a file of "PROMPT OUTPUT" pairs, one a line
// (whitespace or a comma between them; blank lines and lines starting with
// # are skipped).
func ReadLengthFile(path string) ([][2]int, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInput, err)
	}
	defer f.Close()
	var out [][2]int
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.FieldsFunc(line, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' })
		if len(fields) != 2 {
			return nil, fmt.Errorf("%w: %s line %d: want two lengths, PROMPT OUTPUT", ErrInput, path, n)
		}
		p, err1 := strconv.Atoi(fields[0])
		o, err2 := strconv.Atoi(fields[1])
		if err1 != nil || err2 != nil || p < 1 || o < 1 {
			return nil, fmt.Errorf("%w: %s line %d: lengths must be positive integers", ErrInput, path, n)
		}
		out = append(out, [2]int{p, o})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInput, path, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: %s has no lengths", ErrInput, path)
	}
	return out, nil
}

// Workload is the load put on a target.
type Workload struct {
	// Concurrency is the closed loop's number of requests in flight. Used
	// when Rate is 0.
	Concurrency int
	// Rate, when positive, is an open loop: requests arrive as a Poisson
	// process of this many per second, whatever is in flight.
	Rate float64
	// Requests ends the measured phase after this many requests; Duration
	// ends it after this long (arrivals stop, those in flight finish).
	// At least one of them is set.
	Requests int
	Duration time.Duration
	// Warmup requests run first at the same load and are not counted.
	Warmup  int
	Lengths Lengths
	// Sampling of every request; its Seed is offset by the request's
	// index so requests differ but runs repeat.
	Sampling route.Sampling
	// Seed makes the lengths, prompts and arrivals of a run repeat.
	Seed uint64
	// Vocab bounds the random prompt token ids (1..Vocab-1).
	Vocab int
	// Prompts, when set, replaces the random prompts: request i sends
	// Prompts[i mod len(Prompts)] (token ids the caller tokenized, e.g.
	// from ReadPromptFile), with an output length drawn from
	// Lengths.Output; Lengths.Prompt and Pairs are not used.
	Prompts [][]int32
	SLO     SLO
	// Prefixes, when positive, is a number of shared system prompts of
	// PrefixLen tokens each (drawn from Seed); every request starts with
	// one of them, drawn with its own seed, then its own prompt: vLLM's
	// prefix-repetition workload.
	Prefixes, PrefixLen int
	// Burstiness is the shape of the gamma distribution of open-loop
	// arrival gaps (mean 1/Rate): 0 or 1 is a Poisson process, below 1
	// burstier, above 1 steadier (vLLM's --burstiness).
	Burstiness float64
	// Turns, above 1, makes requests the turns of conversations: turn t of
	// a conversation sends the whole history (its first prompt, every
	// earlier turn's generated tokens and new messages) and then its own
	// new message (the workload's prompt, without a prefix). A
	// conversation's turns run one after another in one slot of the loop;
	// Requests counts turns.
	Turns int
}

// Check reports what makes w unusable.
func (w Workload) Check() error {
	switch {
	case w.Rate < 0:
		return fmt.Errorf("%w: rate must be positive", ErrInput)
	case w.Rate == 0 && w.Concurrency < 1:
		return fmt.Errorf("%w: concurrency must be at least 1", ErrInput)
	case w.Requests < 0 || w.Warmup < 0 || w.Duration < 0:
		return fmt.Errorf("%w: requests, warm-up and duration must not be negative", ErrInput)
	case w.Requests == 0 && w.Duration == 0:
		return fmt.Errorf("%w: give a number of requests or a duration", ErrInput)
	case w.Vocab < 2:
		return fmt.Errorf("%w: vocabulary of %d tokens", ErrInput, w.Vocab)
	case w.Prefixes < 0 || (w.Prefixes > 0 && w.PrefixLen < 1):
		return fmt.Errorf("%w: %d shared prefixes of %d tokens", ErrInput, w.Prefixes, w.PrefixLen)
	case w.Burstiness < 0:
		return fmt.Errorf("%w: burstiness must not be negative", ErrInput)
	case w.Turns < 0:
		return fmt.Errorf("%w: turns must not be negative", ErrInput)
	}
	for i, r := range [][2]int{w.Lengths.Prompt, w.Lengths.Output} {
		if i == 0 && len(w.Prompts) > 0 {
			continue
		}
		if len(w.Lengths.Pairs) == 0 && (r[0] < 1 || r[1] < r[0]) {
			return fmt.Errorf("%w: lengths %v", ErrInput, r)
		}
	}
	for _, p := range w.Prompts {
		if len(p) == 0 {
			return fmt.Errorf("%w: an empty prompt", ErrInput)
		}
	}
	return nil
}

// request returns request i of the run: the same i gives the same prompt,
// lengths and sampling seed on every target, so targets are compared on the
// same work. Warm-up requests use indices after every measured one.
func (w Workload) request(i int) route.Request {
	req := w.message(i)
	if w.Prefixes > 0 {
		rng := rand.New(rand.NewPCG(w.Seed, uint64(i)^0x5eed_0f_7e_f1ce))
		req.Prompt = slices.Concat(w.prefix(rng.IntN(w.Prefixes)), req.Prompt)
	}
	return req
}

// prefix is shared system prompt k.
func (w Workload) prefix(k int) []int32 {
	rng := rand.New(rand.NewPCG(w.Seed^0x9e3779b97f4a7c15, uint64(k)))
	p := make([]int32, w.PrefixLen)
	for j := range p {
		p[j] = int32(1 + rng.IntN(w.Vocab-1))
	}
	return p
}

// message is request i without a shared prefix: its own prompt, output
// length and sampling.
func (w Workload) message(i int) route.Request {
	rng := rand.New(rand.NewPCG(w.Seed, uint64(i)))
	var p, o int
	if len(w.Prompts) > 0 {
		o = w.Lengths.Output[0] + rng.IntN(w.Lengths.Output[1]-w.Lengths.Output[0]+1)
		s := w.Sampling
		s.Seed += uint64(i)
		return route.Request{Prompt: w.Prompts[i%len(w.Prompts)], MaxTokens: o, Sampling: s}
	}
	if pairs := w.Lengths.Pairs; len(pairs) > 0 {
		pr := pairs[rng.IntN(len(pairs))]
		p, o = pr[0], pr[1]
	} else {
		p = w.Lengths.Prompt[0] + rng.IntN(w.Lengths.Prompt[1]-w.Lengths.Prompt[0]+1)
		o = w.Lengths.Output[0] + rng.IntN(w.Lengths.Output[1]-w.Lengths.Output[0]+1)
	}
	prompt := make([]int32, p)
	for j := range prompt {
		prompt[j] = int32(1 + rng.IntN(w.Vocab-1))
	}
	s := w.Sampling
	s.Seed += uint64(i)
	return route.Request{Prompt: prompt, MaxTokens: o, Sampling: s}
}

// turns is how many requests a conversation has (1 without Turns).
func (w Workload) turns() int { return max(w.Turns, 1) }

// PromptLens is the shortest and longest prompt the workload sends, in
// tokens.
func (w Workload) PromptLens() [2]int {
	r := w.messageLens()
	if w.Prefixes > 0 {
		r = [2]int{r[0] + w.PrefixLen, r[1] + w.PrefixLen}
	}
	if t := w.turns(); t > 1 {
		// The last turn carries every message and every earlier answer.
		r[1] += (t - 1) * (w.messageLens()[1] + w.LongestOutput())
	}
	return r
}

// LongestOutput is the most tokens a request generates.
func (w Workload) LongestOutput() int {
	n := w.Lengths.Output[1]
	for _, p := range w.Lengths.Pairs {
		n = max(n, p[1])
	}
	return n
}

// messageLens is the shortest and longest message (a prompt without a
// shared prefix or history).
func (w Workload) messageLens() [2]int {
	switch {
	case len(w.Prompts) > 0:
		r := [2]int{len(w.Prompts[0]), len(w.Prompts[0])}
		for _, p := range w.Prompts {
			r = [2]int{min(r[0], len(p)), max(r[1], len(p))}
		}
		return r
	case len(w.Lengths.Pairs) > 0:
		r := [2]int{w.Lengths.Pairs[0][0], w.Lengths.Pairs[0][0]}
		for _, p := range w.Lengths.Pairs {
			r = [2]int{min(r[0], p[0]), max(r[1], p[0])}
		}
		return r
	}
	return w.Lengths.Prompt
}

// arrivals returns the gaps between open-loop arrivals, from the
// workload's seed: gamma distributed with shape Burstiness and mean
// 1/Rate (exponential, a Poisson process, at 0 or 1).
func (w Workload) arrivals() func() time.Duration {
	rng := rand.New(rand.NewPCG(w.Seed, 0xa771))
	k := w.Burstiness
	if k == 0 || k == 1 {
		return func() time.Duration {
			return time.Duration(rng.ExpFloat64() / w.Rate * float64(time.Second))
		}
	}
	return func() time.Duration {
		return time.Duration(gamma(rng, k) / (k * w.Rate) * float64(time.Second))
	}
}

// gamma draws from the gamma distribution of shape k and scale 1
// (Marsaglia and Tsang's method; shapes below 1 by boosting).
func gamma(rng *rand.Rand, k float64) float64 {
	if k < 1 {
		return gamma(rng, k+1) * math.Pow(rng.Float64(), 1/k)
	}
	d := k - 1.0/3
	c := 1 / math.Sqrt(9*d)
	for {
		x := rng.NormFloat64()
		v := 1 + c*x
		if v <= 0 {
			continue
		}
		v = v * v * v
		u := rng.Float64()
		if u < 1-0.0331*x*x*x*x || math.Log(u) < 0.5*x*x+d*(1-v+math.Log(v)) {
			return d * v
		}
	}
}

package verify

import (
	"fmt"
	"github.com/meshnet/shardd/internal/argmax"
	"math"
	"os"
	"path/filepath"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/backend/llamacpp"
	"github.com/meshnet/shardd/gguf"
)

// Step is one forward call of the script, or a rewind.
type Step struct {
	Rows []Row
	// Rewind, when set, trims sequence RewindSeq back to RewindTo before
	// the rows run.
	Rewind    bool
	RewindSeq int
	RewindTo  int
}

// Config controls a verification run.
type Config struct {
	Model   string // whole model GGUF
	Splits  []int  // shard counts to compare, e.g. 2 and 3
	WorkDir string // where split files go; a temp dir when empty
	Threads int
	Decode  int // decode steps after the prefill (16)
	// GPULayers and Device put every model's layers (the whole model's,
	// each shard's) on a GPU, as llamacpp.Config's: the comparison is
	// then of the device's forward with itself, split and whole.
	GPULayers int
	Device    string
	// Boundaries to check; both by default.
	Boundaries []Boundary
	Log        func(format string, args ...any)
}

// backend is the configuration of every model verify opens: path, its
// residual stream rounded to bf16 after the layers in round.
func (c Config) backend(path string, round []int) llamacpp.Config {
	return llamacpp.Config{Path: path, Threads: c.Threads, MaxSeqs: 2, CtxTokens: 256, MaxBatch: 64, RoundBF16: round,
		GPULayers: c.GPULayers, Device: c.Device}
}

// Result is one split compared with its reference: the whole model at an
// f32 boundary; at a bf16 boundary, the whole model with its residual
// stream rounded to bf16 after each boundary layer (Config.RoundBF16 of
// backend/llamacpp), which computes what the route computes.
type Result struct {
	Shards   int
	Boundary Boundary
	// RoundedAfter lists the layers after which the reference rounds (bf16
	// boundaries only).
	RoundedAfter []int
	Rows         int     // logit rows compared
	MaxDiff      float32 // largest |split - reference| over every logit
	// Identical: every logit bitwise equal to the reference.
	Identical bool
	// FirstDiff is the first row (in script order) that differs, -1 when
	// none.
	FirstDiff int
	// ArgmaxAgree counts rows whose greedy token matches the reference's.
	ArgmaxAgree int
	// Against the unrounded whole model (bf16 boundaries): the largest
	// logit difference, the rows whose greedy token differs, and the
	// largest margin by which the unrounded model preferred its own token
	// at such a row (a near-tie that the rounding flipped).
	Unrounded Drift
}

// Drift is a bf16 route measured against the unrounded whole model.
type Drift struct {
	MaxDiff     float32
	Flips       int
	FlipMargin  float32
	ArgmaxAgree int
}

func (r Result) String() string {
	verdict := "bitwise identical"
	if !r.Identical {
		verdict = fmt.Sprintf("DIFFERS from row %d: max |diff| %.3g, greedy token agrees on %d/%d rows", r.FirstDiff, r.MaxDiff, r.ArgmaxAgree, r.Rows)
	}
	ref := "the whole model"
	if r.Boundary == BF16 {
		ref = fmt.Sprintf("the whole model rounded to bf16 after layers %v", r.RoundedAfter)
	}
	out := fmt.Sprintf("%d shards, %s boundary: %d logit rows, %s to %s", r.Shards, r.Boundary, r.Rows, verdict, ref)
	if r.Boundary == BF16 {
		u := r.Unrounded
		out += fmt.Sprintf("; against the unrounded model: max |diff| %.3g, %d greedy tokens flipped", u.MaxDiff, u.Flips)
		if u.Flips > 0 {
			out += fmt.Sprintf(" (near-ties: margins up to %.3g)", u.FlipMargin)
		}
	}
	return out
}

// reference runs the whole model, choosing each next token greedily, and
// returns the script it followed and the logits it produced.
func reference(full backend.Backend, decode int) ([]Step, [][]float32, error) {
	c, err := NewChain([]backend.Backend{full}, F32)
	if err != nil {
		return nil, nil, err
	}
	defer c.Close()
	vocab := full.Info().Vocab
	// Two sessions with different prompts, prefilled in one mixed batch.
	prompts := [][]int32{{1, 17, 42, 7, 99, 3, 250, 11}, {5, 300, 8, 64, 2}}
	pos := []int{0, 0}
	var steps []Step
	var logits [][]float32
	var prefill Step
	for s, p := range prompts {
		for i, tok := range p {
			prefill.Rows = append(prefill.Rows, Row{Seq: s, Pos: i, Token: tok % int32(vocab), Output: i == len(p)-1})
		}
		pos[s] = len(p)
	}
	next := make([]int32, 2)
	run := func(st Step) error {
		if st.Rewind {
			if err := c.Trim(st.RewindSeq, st.RewindTo); err != nil {
				return err
			}
		}
		out, err := c.Forward(st.Rows)
		if err != nil {
			return err
		}
		o := 0
		for _, r := range st.Rows {
			if !r.Output {
				continue
			}
			row := append([]float32(nil), out[o*vocab:(o+1)*vocab]...)
			logits = append(logits, row)
			next[r.Seq] = argmax.Index(row)
			o++
		}
		steps = append(steps, st)
		return nil
	}
	if err := run(prefill); err != nil {
		return nil, nil, err
	}
	for i := range decode {
		st := Step{}
		if i == decode/2 {
			// Rewind session 0 by three positions mid-sequence and carry on
			// from there with a different token.
			st.Rewind, st.RewindSeq, st.RewindTo = true, 0, pos[0]-3
			pos[0] -= 3
			next[0] = (next[0] + 1) % int32(vocab)
		}
		for s := range 2 {
			st.Rows = append(st.Rows, Row{Seq: s, Pos: pos[s], Token: next[s], Output: true})
			pos[s]++
		}
		if err := run(st); err != nil {
			return nil, nil, err
		}
	}
	return steps, logits, nil
}

// replay runs the script on a chain and returns every logit row it
// produced, in order.
func replay(c *Chain, steps []Step, vocab int) ([][]float32, error) {
	var rows [][]float32
	for _, st := range steps {
		if st.Rewind {
			if err := c.Trim(st.RewindSeq, st.RewindTo); err != nil {
				return nil, err
			}
		}
		out, err := c.Forward(st.Rows)
		if err != nil {
			return nil, err
		}
		for o := 0; o*vocab < len(out); o++ {
			rows = append(rows, append([]float32(nil), out[o*vocab:(o+1)*vocab]...))
		}
	}
	return rows, nil
}

// compare sets res's comparison of got with the reference want.
func compare(res *Result, got, want [][]float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("verify: %d logit rows, reference has %d", len(got), len(want))
	}
	res.Identical, res.FirstDiff, res.Rows = true, -1, len(got)
	for k := range got {
		for i := range got[k] {
			if math.Float32bits(got[k][i]) != math.Float32bits(want[k][i]) {
				if res.Identical {
					res.FirstDiff = k
				}
				res.Identical = false
				res.MaxDiff = max(res.MaxDiff, float32(math.Abs(float64(got[k][i]-want[k][i]))))
			}
		}
		if argmax.Index(got[k]) == argmax.Index(want[k]) {
			res.ArgmaxAgree++
		}
	}
	return nil
}

// drift measures got against the unrounded whole model's rows.
func drift(got, whole [][]float32) Drift {
	var d Drift
	for k := range got {
		for i := range got[k] {
			d.MaxDiff = max(d.MaxDiff, float32(math.Abs(float64(got[k][i]-whole[k][i]))))
		}
		g, w := argmax.Index(got[k]), argmax.Index(whole[k])
		if g == w {
			d.ArgmaxAgree++
			continue
		}
		d.Flips++
		d.FlipMargin = max(d.FlipMargin, whole[k][w]-whole[k][g])
	}
	return d
}

// Corrupt, when set (tests only), changes the bf16 chain's boundary
// values before they cross, e.g. one value by one bf16 ulp, to prove the
// comparison sees it.
var Corrupt func(hidden []byte)

// Run splits cfg.Model each way in cfg.Splits and compares every split, at
// every boundary dtype, with the whole model.
func Run(cfg Config) ([]Result, error) {
	if cfg.Decode == 0 {
		cfg.Decode = 16
	}
	if len(cfg.Boundaries) == 0 {
		cfg.Boundaries = []Boundary{F32, BF16}
	}
	logf := cfg.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if cfg.WorkDir == "" {
		dir, err := os.MkdirTemp("", "shardd-verify-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		cfg.WorkDir = dir
	}
	open := func(path string) (*llamacpp.Backend, error) {
		return llamacpp.Open(cfg.backend(path, nil))
	}
	full, err := open(cfg.Model)
	if err != nil {
		return nil, err
	}
	defer full.Close()
	vocab := full.Info().Vocab
	steps, want, err := reference(full, cfg.Decode)
	if err != nil {
		return nil, err
	}
	logf("whole model: %d forward calls, %d logit rows", len(steps), len(want))

	var results []Result
	for _, n := range cfg.Splits {
		meta := full.Meta()
		if n < 2 || n > meta.BlockCount {
			return results, fmt.Errorf("verify: cannot split %d layers %d ways", meta.BlockCount, n)
		}
		dir := filepath.Join(cfg.WorkDir, fmt.Sprintf("split%d", n))
		ranges, err := meta.EvenRanges(n)
		if err != nil {
			return results, fmt.Errorf("verify: %w", err)
		}
		paths, err := gguf.Split(cfg.Model, ranges, dir, nil)
		if err != nil {
			return results, err
		}
		var shards []backend.Backend
		for _, p := range paths {
			b, err := open(p)
			if err != nil {
				closeAll(shards)
				return results, err
			}
			shards = append(shards, b)
		}
		for _, bd := range cfg.Boundaries {
			r, err := compareSplit(shards, ranges, bd, steps, want, vocab, func(round []int) (backend.Backend, error) {
				return llamacpp.Open(cfg.backend(cfg.Model, round))
			})
			if err != nil {
				closeAll(shards)
				return results, err
			}
			r.Shards = n
			logf("%s", r)
			results = append(results, r)
		}
		closeAll(shards)
	}
	return results, nil
}

// compareSplit replays the script on the shards at boundary bd and compares
// with the reference: want (the whole model) at f32; at bf16, the whole
// model opened by rounded with the boundary layers rounded, and want is
// the unrounded model the drift is measured against.
func compareSplit(shards []backend.Backend, ranges []gguf.Range, bd Boundary, steps []Step, want [][]float32, vocab int,
	rounded func(round []int) (backend.Backend, error)) (Result, error) {
	res := Result{Boundary: bd}
	run := func(bs []backend.Backend, bd Boundary) ([][]float32, error) {
		for _, s := range bs {
			for seq := range 2 {
				s.SeqTrim(seq, 0)
			}
		}
		c, err := NewChain(bs, bd)
		if err != nil {
			return nil, err
		}
		defer c.Close()
		return replay(c, steps, vocab)
	}
	got, err := run(shards, bd)
	if err != nil {
		return res, err
	}
	ref := want
	if bd == BF16 {
		for _, r := range ranges[:len(ranges)-1] {
			res.RoundedAfter = append(res.RoundedAfter, r.End-1)
		}
		whole, err := rounded(res.RoundedAfter)
		if err != nil {
			return res, err
		}
		ref, err = run([]backend.Backend{whole}, F32)
		whole.Close()
		if err != nil {
			return res, err
		}
		res.Unrounded = drift(got, want)
	}
	return res, compare(&res, got, ref)
}

func closeAll(bs []backend.Backend) {
	for _, b := range bs {
		b.Close()
	}
}

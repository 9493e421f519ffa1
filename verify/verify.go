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
	// Boundaries to check; both by default.
	Boundaries []Boundary
	Log        func(format string, args ...any)
}

// Result is one split compared with the whole model.
type Result struct {
	Shards   int
	Boundary Boundary
	Rows     int     // logit rows compared
	MaxDiff  float32 // largest |split - whole| over every logit
	// Identical: every logit bitwise equal.
	Identical bool
	// ArgmaxAgree counts rows whose greedy token matches the whole model's.
	ArgmaxAgree int
}

func (r Result) String() string {
	verdict := "bitwise identical"
	if !r.Identical {
		verdict = fmt.Sprintf("max |diff| %.3g, greedy token agrees on %d/%d rows", r.MaxDiff, r.ArgmaxAgree, r.Rows)
	}
	return fmt.Sprintf("%d shards, %s boundary: %d logit rows, %s", r.Shards, r.Boundary, r.Rows, verdict)
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

// replay runs the script on a chain and compares with the reference logits.
func replay(c *Chain, steps []Step, want [][]float32, vocab int) (Result, error) {
	res := Result{Identical: true}
	k := 0
	for _, st := range steps {
		if st.Rewind {
			if err := c.Trim(st.RewindSeq, st.RewindTo); err != nil {
				return res, err
			}
		}
		out, err := c.Forward(st.Rows)
		if err != nil {
			return res, err
		}
		for o := 0; o*vocab < len(out); o++ {
			got, ref := out[o*vocab:(o+1)*vocab], want[k]
			k++
			res.Rows++
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
					res.Identical = false
					res.MaxDiff = max(res.MaxDiff, float32(math.Abs(float64(got[i]-ref[i]))))
				}
			}
			if argmax.Index(got) == argmax.Index(ref) {
				res.ArgmaxAgree++
			}
		}
	}
	if k != len(want) {
		return res, fmt.Errorf("verify: compared %d logit rows, reference has %d", k, len(want))
	}
	return res, nil
}

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
		return llamacpp.Open(llamacpp.Config{Path: path, Threads: cfg.Threads, MaxSeqs: 2, CtxTokens: 256, MaxBatch: 64})
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
		paths, err := gguf.Split(cfg.Model, gguf.EvenRanges(meta.BlockCount, n), dir, nil)
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
			for _, s := range shards {
				for seq := range 2 {
					s.SeqTrim(seq, 0)
				}
			}
			c, err := NewChain(shards, bd)
			if err != nil {
				closeAll(shards)
				return results, err
			}
			r, err := replay(c, steps, want, vocab)
			c.Close()
			if err != nil {
				closeAll(shards)
				return results, err
			}
			r.Shards, r.Boundary = n, bd
			logf("%s", r)
			results = append(results, r)
		}
		closeAll(shards)
	}
	return results, nil
}

func closeAll(bs []backend.Backend) {
	for _, b := range bs {
		b.Close()
	}
}

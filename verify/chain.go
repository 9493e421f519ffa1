// Package verify proves that a split model computes what the whole model
// computes: it runs the unsplit model and each split through the real
// llama.cpp backend on the same script and compares logits.
//
// A Chain strings shards together in one process, hidden states passing from
// one shard's output straight into the next shard's batch, converted to the
// boundary dtype on the way exactly as the wire would carry them.
package verify

import (
	"fmt"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/stages/dtype"
)

// Boundary is the dtype hidden states cross shard boundaries in.
type Boundary string

const (
	// BF16 is the contract's canonical boundary dtype.
	BF16 Boundary = "bf16"
	// F32 carries the residual stream unrounded.
	F32 Boundary = "f32"
)

// Row is one token position of one sequence in a forward call.
type Row struct {
	Seq, Pos int
	Token    int32
	Output   bool // produce logits for this row
}

// Chain runs rows through a route of shards in order.
type Chain struct {
	shards   []backend.Backend
	batches  []backend.Batch
	outs     []backend.Output
	boundary Boundary
	scratch  []byte
}

// NewChain strings shards (first takes tokens, last produces logits).
func NewChain(shards []backend.Backend, boundary Boundary) (*Chain, error) {
	if len(shards) == 0 || !shards[0].Info().TokensIn || !shards[len(shards)-1].Info().LogitsOut {
		return nil, fmt.Errorf("verify: a chain must start at layer 0 and end with logits")
	}
	c := &Chain{shards: shards, boundary: boundary, outs: make([]backend.Output, len(shards))}
	for _, s := range shards {
		b, err := s.NewBatch()
		if err != nil {
			c.Close()
			return nil, err
		}
		c.batches = append(c.batches, b)
	}
	return c, nil
}

// Close frees the chain's batches (not the shards).
func (c *Chain) Close() {
	for i, b := range c.batches {
		c.shards[i].FreeBatch(b)
	}
	c.batches = nil
}

// Forward runs rows through every shard and returns the logits of the rows
// flagged Output, Vocab floats each, in row order. The result is valid until
// the next Forward.
func (c *Chain) Forward(rows []Row) ([]float32, error) {
	var hidden []float32
	for i, s := range c.shards {
		b := c.batches[i]
		b.Reset()
		h := s.Info().Hidden
		for r, row := range rows {
			var err error
			switch {
			case i == 0:
				err = b.AddToken(row.Seq, row.Pos, row.Token, row.Output)
			case c.boundary == BF16:
				c.scratch = dtype.AppendF32ToBF16(c.scratch[:0], hidden[r*h:(r+1)*h])
				if Corrupt != nil {
					Corrupt(c.scratch)
				}
				err = b.AddHiddenBF16(row.Seq, row.Pos, c.scratch, row.Output)
			default:
				err = b.AddHiddenF32(row.Seq, row.Pos, hidden[r*h:(r+1)*h], row.Output)
			}
			if err != nil {
				return nil, fmt.Errorf("verify: shard %d row %d: %w", i, r, err)
			}
		}
		if err := s.Forward(b, &c.outs[i]); err != nil {
			return nil, fmt.Errorf("verify: shard %d: %w", i, err)
		}
		hidden = c.outs[i].Hidden
	}
	return c.outs[len(c.shards)-1].Logits, nil
}

// Trim removes positions >= from of seq on every shard.
func (c *Chain) Trim(seq, from int) error {
	for i, s := range c.shards {
		if err := s.SeqTrim(seq, from); err != nil {
			return fmt.Errorf("verify: shard %d: %w", i, err)
		}
	}
	return nil
}

package backend

import (
	"errors"
	"fmt"
	"math"
)

// ErrProbe reports a failed capability probe.
var ErrProbe = errors.New("backend: capability probe failed")

// ProbeRows is the size of the probe's forward pass.
const ProbeRows = 4

// Probe proves the shard can execute: a bounded real forward of ProbeRows
// positions on the highest sequence id, checking that the output has the
// right size and is finite, then freeing the sequence. A worker reports
// `validated` only after Probe passes (the contract's capability rule:
// detected hardware is not a capability).
func Probe(b Backend) error {
	info := b.Info()
	seq := info.MaxSeqs - 1
	batch, err := b.NewBatch()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrProbe, err)
	}
	defer b.FreeBatch(batch)
	defer b.SeqTrim(seq, 0)
	row := make([]float32, info.Hidden)
	for i := range ProbeRows {
		if info.TokensIn {
			err = batch.AddToken(seq, i, int32(i%max(info.Vocab, 1)), true)
		} else {
			for j := range row {
				row[j] = float32(math.Sin(float64(i*len(row)+j))) * 0.1
			}
			err = batch.AddHiddenF32(seq, i, row, true)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrProbe, err)
		}
	}
	var out Output
	if err := b.Forward(batch, &out); err != nil {
		return fmt.Errorf("%w: %v", ErrProbe, err)
	}
	got, want := out.Hidden, ProbeRows*info.Hidden
	if info.LogitsOut {
		got, want = out.Logits, ProbeRows*info.Vocab
	}
	if len(got) != want {
		return fmt.Errorf("%w: %d output values, want %d", ErrProbe, len(got), want)
	}
	for _, v := range got {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return fmt.Errorf("%w: output is not finite", ErrProbe)
		}
	}
	return nil
}

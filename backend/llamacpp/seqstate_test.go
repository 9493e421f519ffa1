package llamacpp

import (
	"math"
	"testing"

	"github.com/meshnet/shardd/backend"
)

// TestSeqStateRoundTrip: a sequence's KV cells saved and loaded into
// another sequence (placed elsewhere in the shared KV buffer, beside a
// third sequence's cells) make the next decode step's logits bitwise
// those of the original sequence; trimmed, it continues from the trim.
func TestSeqStateRoundTrip(t *testing.T) {
	model, _ := tinyShards(t)
	b := open(t, model)
	bt, _ := b.NewBatch()
	defer b.FreeBatch(bt)
	var out backend.Output
	prompt := []int32{5, 9, 33, 2, 71, 8, 100, 3}
	run := func(seq, pos int, toks []int32) []float32 {
		t.Helper()
		bt.Reset()
		for i, tok := range toks {
			if err := bt.AddToken(seq, pos+i, tok, i == len(toks)-1); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Forward(bt, &out); err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), out.Logits...)
	}
	run(0, 0, prompt)
	run(2, 0, []int32{7, 7, 7}) // cells of another sequence in between
	state, err := b.SeqSave(nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.SeqLoad(1, state); err != nil {
		t.Fatal(err)
	}
	want := run(0, len(prompt), []int32{42})
	got := run(1, len(prompt), []int32{42})
	for i := range want {
		if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
			t.Fatalf("logit %d: %v after a load, %v in the original sequence", i, got[i], want[i])
		}
	}
	// Trimmed after the load, it continues from the trimmed position.
	if err := b.SeqTrim(1, 4); err != nil {
		t.Fatal(err)
	}
	run(1, 4, prompt[4:])
	if err := b.SeqLoad(3, []byte{1, 2, 3}); err == nil {
		t.Fatal("loaded garbage")
	}
}

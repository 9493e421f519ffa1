package llamacpp

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/gguf"
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

// TestSeqInOrder: a sequence whose later positions land in earlier cells
// of the shared KV buffer (another sequence freed the cells before its own)
// holds its positions in order only up to there, and SeqInOrder says so;
// an entry of that in-order prefix, loaded alone and continued, is bitwise
// the lone run. A sequence laid alone, on the sliding-window model and on
// separate KV streams too, is in order to its end.
func TestSeqInOrder(t *testing.T) {
	model, _ := tinyShards(t)
	prompt := []int32{5, 9, 33, 2, 71, 8, 100, 3, 14, 15, 92, 65, 35, 89, 79, 32}
	var out backend.Output
	run := func(b *Backend, seq, pos int, toks []int32) []float32 {
		t.Helper()
		bt, _ := b.NewBatch()
		defer b.FreeBatch(bt)
		for i, tok := range toks {
			if err := bt.AddToken(seq, pos+i, tok, true); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Forward(bt, &out); err != nil {
			t.Fatal(err)
		}
		return append([]float32(nil), out.Logits...)
	}
	inOrder := func(b *Backend, seq int) int {
		t.Helper()
		state, err := b.SeqSave(nil, seq)
		if err != nil {
			t.Fatal(err)
		}
		return b.SeqInOrder(state)
	}

	alone := open(t, model)
	want := append(run(alone, 0, 0, prompt[:8]), run(alone, 0, 8, prompt[8:])...)
	if n := inOrder(alone, 0); n != len(prompt) {
		t.Fatalf("a sequence alone: %d positions in order, want %d", n, len(prompt))
	}

	b := open(t, model)
	run(b, 0, 0, []int32{7, 7, 7, 7, 7, 7, 7, 7}) // cells 0-7
	first := run(b, 1, 0, prompt[:8])             // cells 8-15
	if err := b.SeqTrim(0, 0); err != nil {       // frees cells 0-7: the cache's head goes back to 0
		t.Fatal(err)
	}
	late := run(b, 1, 8, prompt[8:]) // positions 8-15 in cells 0-7
	if n := inOrder(b, 1); n != 8 {
		t.Fatalf("positions 8-15 laid before 0-7: %d positions in order, want 8", n)
	}
	for i := range first {
		if math.Float32bits(first[i]) != math.Float32bits(want[i]) {
			t.Fatalf("in-order row %d logit %d: %v, alone %v", i/512, i%512, first[i], want[i])
		}
	}
	t.Logf("rows laid out of order: %d of %d logits differ from the lone run", differing(late, want[len(first):]), len(late))

	// The in-order prefix cut out as an entry, loaded into another
	// sequence once the buffer is empty, continued: the lone run's bits.
	state, err := b.SeqSave(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := b.SeqCut(nil, state, 8)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.SeqInOrder(entry); n != 8 || len(entry) >= len(state) {
		t.Fatalf("the cut state: %d positions in order, %d bytes of %d", n, len(entry), len(state))
	}
	// Without llama.cpp's header (magic, sequence id) the bytes are no
	// state: refused, not parsed from the wrong offset.
	if n, ok := stateInOrder(state[8:]); ok || n != 0 {
		t.Fatalf("a state without its header: %d positions in order, ok %v", n, ok)
	}
	if _, err := b.SeqCut(nil, state[8:], 8); err == nil {
		t.Fatal("SeqCut took a state without its header")
	}
	if err := b.SeqTrim(1, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.SeqLoad(2, entry); err != nil {
		t.Fatal(err)
	}
	if next := b.SeqNext(2); next != 8 {
		t.Fatalf("the loaded entry continues at %d, want 8", next)
	}
	got := run(b, 2, 8, prompt[8:])
	if d := differing(got, want[len(first):]); d != 0 {
		t.Fatalf("continued from the in-order prefix: %d logits differ from the lone run", d)
	}

	// Other cache layouts: a sliding-window model (two caches in the
	// state) and separate KV streams.
	dir := t.TempDir()
	gemma := filepath.Join(dir, "gemma3.gguf")
	if err := gguf.Generate(gemma, gguf.Presets["tiny"].ForArch("gemma3")); err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]Config{
		"gemma3 (sliding window)": {Path: gemma, Threads: 2, MaxSeqs: 4, CtxTokens: 128, MaxBatch: 8},
		"separate KV streams":     {Path: model, Threads: 2, MaxSeqs: 4, CtxTokens: 128, MaxBatch: 8, SeparateKV: true},
	} {
		o, err := Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		run(o, 3, 0, prompt[:8])
		run(o, 3, 8, prompt[8:])
		state, err := o.SeqSave(nil, 3)
		if err != nil {
			t.Fatal(err)
		}
		cut, err := o.SeqCut(nil, state, 5)
		if err != nil {
			t.Fatal(err)
		}
		o.SeqTrim(3, 0)
		loadErr := o.SeqLoad(1, cut)
		next := o.SeqNext(1)
		o.Close()
		if n := o.SeqInOrder(state); n != len(prompt) {
			t.Errorf("%s: %d positions in order, want %d", name, n, len(prompt))
		}
		if n := o.SeqInOrder(cut); n != 5 || loadErr != nil || next != 5 {
			t.Errorf("%s: cut to 5 positions: %d in order, loaded (%v) to continue at %d", name, n, loadErr, next)
		}
	}
	if n := b.SeqInOrder([]byte{1, 0, 0, 0, 9, 0, 0, 0}); n != 0 {
		t.Fatalf("a cut state: %d positions", n)
	}
}

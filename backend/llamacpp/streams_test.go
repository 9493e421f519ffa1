package llamacpp

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"testing"

	"github.com/meshnet/shardd/backend"
)

// TestStreamsBatchEqualsAlone: on separate KV streams, one decode forward
// carrying rows of five sequences (out of order, with an idle sequence and
// an empty one between them, which get placeholder rows) gives each row
// bitwise what the same step gives when its sequence runs alone; the
// placeholders leave nothing behind. So do forwards of three sequences'
// prompt chunks of two rows each (placeholders in the gaps) and of five
// (the forward split at the gaps). Checked where the shard produces
// logits (the whole model) and hidden states (its first shard).
func TestStreamsBatchEqualsAlone(t *testing.T) {
	model, shards := tinyShards(t)
	for _, path := range []string{shards[0], model} {
		open := func() *Backend { return openStreams(t, path, 8) }
		together, alone := open(), open()
		prompts := map[int][]int32{0: {5, 9, 33}, 1: {7}, 3: {2, 71, 8, 100, 3, 4}, 4: {11, 12}, 6: {40, 41, 42, 43}, 5: {9, 9}}
		for _, b := range []*Backend{together, alone} {
			for seq, p := range prompts {
				rows(t, b, seq, 0, p)
			}
		}
		step := []int{6, 0, 3, 4, 1} // 5 is idle, 2 and 7 empty
		bt, _ := together.NewBatch()
		defer together.FreeBatch(bt)
		for i, seq := range step {
			if err := bt.AddToken(seq, len(prompts[seq]), int32(60+i), true); err != nil {
				t.Fatal(err)
			}
		}
		var out backend.Output
		if err := together.Forward(bt, &out); err != nil {
			t.Fatal(err)
		}
		got := out.Logits
		width := together.info.Vocab
		if !together.info.LogitsOut {
			got, width = out.Hidden, together.info.Hidden
		}
		got = append([]float32(nil), got...)
		for i, seq := range step {
			want := rows(t, alone, seq, len(prompts[seq]), []int32{int32(60 + i)})
			for j := range want {
				if math.Float32bits(want[j]) != math.Float32bits(got[i*width+j]) {
					t.Fatalf("%s: sequence %d, value %d: %v beside the others, %v alone", shortName(path), seq, j, got[i*width+j], want[j])
				}
			}
		}
		// The placeholders are gone: the idle and the empty sequences go
		// on from where they were.
		rows(t, together, 5, 2, []int32{1})
		rows(t, together, 2, 0, []int32{1, 2})
		// Prompt chunks of as many rows each, in one forward, with
		// sequences between them given as many placeholder rows.
		bt.Reset()
		chunked := []int{6, 0, 4}
		chunk := func(seq int) []int32 { return []int32{int32(seq + 20), int32(seq)} }
		for _, seq := range chunked {
			for j, tok := range chunk(seq) {
				if err := bt.AddToken(seq, len(prompts[seq])+1+j, tok, j == 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		placed, _ := together.StreamStats()
		if err := together.Forward(bt, &out); err != nil {
			t.Fatal(err)
		}
		if now, _ := together.StreamStats(); now-placed != 8 {
			t.Fatalf("%s: %d placeholder rows for the chunks, want 2 on each of streams 1, 2, 3 and 5", shortName(path), now-placed)
		}
		got = out.Logits
		if !together.info.LogitsOut {
			got, width = out.Hidden, 2*together.info.Hidden
		}
		got = append([]float32(nil), got...)
		for i, seq := range chunked {
			want := rows(t, alone, seq, len(prompts[seq])+1, chunk(seq))
			equalBits(t, fmt.Sprintf("%s: chunk of sequence %d", shortName(path), seq), got[i*width:(i+1)*width], want)
		}
		// Chunks of five rows on streams 1 and 6: the gap would take more
		// placeholder rows than a ubatch of its own costs, so the forward
		// splits there.
		bt.Reset()
		long := func(seq int) []int32 { return []int32{int32(seq + 30), 1, 2, 3, int32(seq)} }
		at := map[int]int{1: len(prompts[1]) + 1, 6: len(prompts[6]) + 3}
		for _, seq := range []int{1, 6} {
			for j, tok := range long(seq) {
				if err := bt.AddToken(seq, at[seq]+j, tok, j == 4); err != nil {
					t.Fatal(err)
				}
			}
		}
		placed, copied := together.StreamStats()
		if err := together.Forward(bt, &out); err != nil {
			t.Fatal(err)
		}
		if p, c := together.StreamStats(); p != placed || c != copied {
			t.Fatalf("%s: %d placeholder rows and %d stream copies for chunks of five, want none", shortName(path), p-placed, c-copied)
		}
		got = out.Logits
		if !together.info.LogitsOut {
			got, width = out.Hidden, 5*together.info.Hidden
		}
		got = append([]float32(nil), got...)
		for i, seq := range []int{1, 6} {
			want := rows(t, alone, seq, at[seq], long(seq))
			equalBits(t, fmt.Sprintf("%s: chunk of five of sequence %d", shortName(path), seq), got[i*width:(i+1)*width], want)
		}
		// Unequal rows of several sequences are refused.
		bt.Reset()
		for _, r := range [][2]int{{0, 12}, {0, 13}, {1, 2}} {
			if err := bt.AddToken(r[0], r[1], 3, true); err != nil {
				t.Fatal(err)
			}
		}
		if err := together.Forward(bt, &out); !errors.Is(err, backend.ErrInput) {
			t.Fatalf("two rows of a sequence beside one of another's: %v", err)
		}
	}
}

// rows runs toks for seq from pos alone and returns the last row's
// logits, or every row's hidden states.
func rows(t *testing.T, b *Backend, seq, pos int, toks []int32) []float32 {
	t.Helper()
	bt, _ := b.NewBatch()
	defer b.FreeBatch(bt)
	for i, tok := range toks {
		if err := bt.AddToken(seq, pos+i, tok, i == len(toks)-1); err != nil {
			t.Fatal(err)
		}
	}
	var out backend.Output
	if err := b.Forward(bt, &out); err != nil {
		t.Fatalf("sequence %d at %d: %v", seq, pos, err)
	}
	if b.info.LogitsOut {
		return append([]float32(nil), out.Logits...)
	}
	return append([]float32(nil), out.Hidden...)
}

// TestStreamsCompact: two groups of sequences scattered over the streams
// decode in turn, as a route's worker sees them. After the second round
// the sequences have moved onto consecutive streams (stream copies made,
// no placeholder rows since), and every row, every saved state's next rows
// once loaded elsewhere and a trimmed sequence's next rows are bitwise what
// the same steps give on a backend where each sequence runs alone on the
// stream of its number.
func TestStreamsCompact(t *testing.T) {
	model, shards := tinyShards(t)
	for _, path := range []string{shards[0], model} {
		open := func() *Backend { return openStreams(t, path, 10) }
		together, alone := open(), open()
		groups := [][]int{{0, 3, 5, 8}, {1, 2, 6}} // streams 4, 7 and 9 hold nothing
		pos := map[int]int{}
		for _, b := range []*Backend{together, alone} {
			for _, g := range groups {
				for _, seq := range g {
					p := []int32{int32(seq + 1), 7, int32(2 * seq)}
					rows(t, b, seq, 0, p)
					pos[seq] = len(p)
				}
			}
		}
		width := together.info.Vocab
		if !together.info.LogitsOut {
			width = together.info.Hidden
		}
		bt, _ := together.NewBatch()
		defer together.FreeBatch(bt)
		var placed int64
		for round := range 6 {
			if round == 4 {
				placed, _ = together.StreamStats()
			}
			for _, g := range groups {
				bt.Reset()
				for _, seq := range g {
					if err := bt.AddToken(seq, pos[seq], int32(10*round+seq), true); err != nil {
						t.Fatal(err)
					}
				}
				var out backend.Output
				if err := together.Forward(bt, &out); err != nil {
					t.Fatal(err)
				}
				got := out.Logits
				if !together.info.LogitsOut {
					got = out.Hidden
				}
				got = append([]float32(nil), got...)
				for i, seq := range g {
					want := rows(t, alone, seq, pos[seq], []int32{int32(10*round + seq)})
					equalBits(t, fmt.Sprintf("%s: round %d, sequence %d", shortName(path), round, seq), got[i*width:(i+1)*width], want)
					pos[seq]++
				}
			}
		}
		placeholders, copies := together.StreamStats()
		if copies == 0 || placeholders != placed {
			t.Fatalf("%s: %d stream copies, %d placeholder rows in the last two rounds; want copies and no placeholders", shortName(path), copies, placeholders-placed)
		}
		// A moved sequence's saved state, loaded elsewhere, goes on as the
		// solo run does. (The bytes differ: a state names its stream.)
		check := open()
		for _, g := range groups {
			for _, seq := range g {
				state, err := together.SeqSave(nil, seq)
				if err != nil {
					t.Fatal(err)
				}
				if err := check.SeqTrim(0, 0); err != nil {
					t.Fatal(err)
				}
				if err := check.SeqLoad(0, state); err != nil {
					t.Fatal(err)
				}
				toks := []int32{2, 7, 1}
				equalBits(t, fmt.Sprintf("%s: sequence %d saved and loaded", shortName(path), seq), rows(t, check, 0, pos[seq], toks), rows(t, alone, seq, pos[seq], toks))
			}
		}
		// A moved sequence trims and goes on, and a freed one starts afresh.
		for _, b := range []*Backend{together, alone} {
			if err := b.SeqTrim(8, 4); err != nil {
				t.Fatal(err)
			}
			if err := b.SeqTrim(1, 0); err != nil {
				t.Fatal(err)
			}
		}
		for seq, from := range map[int]int{8: 4, 1: 0} {
			toks := []int32{3, 1, 4, 1, 5}
			equalBits(t, fmt.Sprintf("%s: sequence %d from %d", shortName(path), seq, from), rows(t, together, seq, from, toks), rows(t, alone, seq, from, toks))
		}
	}
}

// openStreams opens path with a KV stream for each of seqs sequences, 32
// cells each.
func openStreams(t *testing.T, path string, seqs int) *Backend {
	t.Helper()
	b, err := Open(Config{Path: path, Threads: 1, MaxSeqs: seqs, CtxTokens: seqs * 32, MaxBatch: 16, SeparateKV: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func equalBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for j := range want {
		if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
			t.Fatalf("%s, value %d: %v, want %v", what, j, got[j], want[j])
		}
	}
}

// TestStreamsFailedForwardKeepsOrder: a forward of two sequences on
// streams too far apart for placeholders, stopped part way (a preemption),
// leaves both streams as they were: once the caller trims what the
// forward placed (as the engine does), each sequence's next chunk and
// decode steps are bitwise what they are alone. (llama.cpp, given such a
// batch, runs it as two ubatches: it finds slots for both first, and then
// restores each stream's cell search head from another stream's; a stream
// whose ubatch never ran kept that head, from where its cells went out of
// position order, and attention, which sums a row's cells in cell order,
// computed other bits.)
func TestStreamsFailedForwardKeepsOrder(t *testing.T) {
	model, _ := tinyShards(t)
	together, alone := openStreams(t, model, 8), openStreams(t, model, 8)
	toks := func(n, base int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(base + 3*i)
		}
		return p
	}
	for _, b := range []*Backend{together, alone} {
		rows(t, b, 0, 0, toks(12, 1)) // stream 0's head ends at 12
		rows(t, b, 1, 0, toks(4, 2))
		rows(t, b, 6, 0, toks(4, 3))
	}
	bt, _ := together.NewBatch()
	defer together.FreeBatch(bt)
	for _, seq := range []int{1, 6} {
		for j, tok := range toks(5, 5+seq) {
			if err := bt.AddToken(seq, 4+j, tok, j == 4); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Preempted before it starts: the forward stops in its first ubatch.
	atomic.StoreInt32(together.enabledWord(), 1)
	atomic.StoreInt32(together.preemptWord(), 1)
	var out backend.Output
	err := together.forward(bt, &out)
	atomic.StoreInt32(together.enabledWord(), 0)
	if !errors.Is(err, backend.ErrPreempted) {
		t.Fatalf("a preempted forward: %v, want ErrPreempted", err)
	}
	for _, seq := range []int{1, 6} {
		if err := together.SeqTrim(seq, 4); err != nil {
			t.Fatal(err)
		}
	}
	for _, seq := range []int{1, 6} {
		what := fmt.Sprintf("sequence %d after the preempted forward", seq)
		equalBits(t, what+", its chunk", rows(t, together, seq, 4, toks(5, 5+seq)), rows(t, alone, seq, 4, toks(5, 5+seq)))
		for pos := 9; pos < 13; pos++ {
			equalBits(t, fmt.Sprintf("%s, its step at %d", what, pos), rows(t, together, seq, pos, []int32{int32(pos)}), rows(t, alone, seq, pos, []int32{int32(pos)}))
		}
	}
}

// TestExactModeTurnsTiledOff: ggml's tiled K-quant matmul, which rounds
// otherwise than vec_dot and takes only batches of 8 rows or more, is off
// while a backend on separate KV streams (the exact mode) is open, and on
// again once none is.
func TestExactModeTurnsTiledOff(t *testing.T) {
	model, _ := tinyShards(t)
	if !tiledOn() {
		t.Fatal("the tiled kernel is off with no exact-mode backend open")
	}
	open := func() *Backend {
		b, err := Open(Config{Path: model, Threads: 1, MaxSeqs: 2, CtxTokens: 64, MaxBatch: 16, SeparateKV: true})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	a, b := open(), open()
	a.Close()
	if tiledOn() {
		t.Fatal("the tiled kernel is on while an exact-mode backend is open")
	}
	b.Close()
	b.Close() // idempotent: counted once
	if !tiledOn() {
		t.Fatal("the tiled kernel stayed off after the exact-mode backends closed")
	}
}

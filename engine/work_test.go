package engine

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/meshnet/shardd/bufpool/bufpooltest"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/decode"
)

// A payload aliasing the message at an odd offset is copied to aligned
// memory before f32s views it; an aligned one is used as is.
func TestAlignedBody(t *testing.T) {
	pool := bufpooltest.New(t)
	backing := make([]byte, 64+1)
	for i := range backing {
		backing[i] = byte(i)
	}
	var tensor stages.Tensor
	defer tensor.Reset()
	odd := backing[1:]
	if uintptr(unsafe.Pointer(&odd[0]))%4 == 0 {
		odd = backing[2:]
	}
	got := alignedBody(&tensor, odd, pool)
	if uintptr(unsafe.Pointer(&got[0]))%4 != 0 || !bytes.Equal(got, odd) || &got[0] == &odd[0] {
		t.Fatal("misaligned body was not copied to aligned memory")
	}
	if v := f32s(got); len(v) != len(odd)/4 {
		t.Fatalf("view of %d values", len(v))
	}
	aligned := backing[:64:64]
	if uintptr(unsafe.Pointer(&aligned[0]))%4 == 0 && &alignedBody(&tensor, aligned, pool)[0] != &aligned[0] {
		t.Fatal("aligned body was copied")
	}
}

// A work item recycled twice would be handed to two messages at once: the
// second recycle panics instead. A recycled item keeps its arrays and
// nothing else.
func TestWorkRecycle(t *testing.T) {
	st := &stream{id: "s"}
	in := inboundPool.Get().(*decode.Inbound)
	w := newWork(st, in)
	w.setWorkID("step/7")
	w.tokenIDs = append(w.tokenIDs, 1, 2, 3)
	w.recycle()
	if w.st != nil || w.in != nil || w.WorkID != "" || len(w.tokenIDs) != 0 || cap(w.idBuf) < len("step/7") {
		t.Fatalf("recycled item kept %+v", w)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a second recycle did not panic")
		}
	}()
	w.recycle()
}

// A chunk that is not its prompt's last bounds where the prompt ends, so
// the scheduler can count the chunks of a short prompt as one (a crowd).
func TestPromptEnd(t *testing.T) {
	for _, c := range []struct {
		first, tokens int
		info          *shardv1.ChunkInfo
		want          int
	}{
		{0, 2, &shardv1.ChunkInfo{ChunkIndex: 0, ChunkCount: 4}, 8},
		{4, 2, &shardv1.ChunkInfo{ChunkIndex: 2, ChunkCount: 4}, 8},
		{6, 2, &shardv1.ChunkInfo{ChunkIndex: 3, ChunkCount: 4, FinalChunk: true}, 0},
		{0, 128, &shardv1.ChunkInfo{}, 0}, // no count: unknown
	} {
		if got := promptEnd(c.first, c.tokens, c.info); got != c.want {
			t.Errorf("chunk %v at %d of %d tokens: prompt end %d, want %d", c.info, c.first, c.tokens, got, c.want)
		}
	}
}

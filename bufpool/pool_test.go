package bufpool

import (
	"strings"
	"testing"

	"google.golang.org/grpc/mem"
)

var _ mem.BufferPool = (*Pool)(nil)

func TestClassOf(t *testing.T) {
	tests := []struct{ n, class int }{
		{0, 0}, {1, 0}, {512, 0}, {513, 1}, {1024, 1}, {1025, 2},
		{1 << 20, 20 - minClassShift}, {MaxPooled, numClasses - 1}, {MaxPooled + 1, -1},
	}
	for _, tt := range tests {
		if got := classOf(tt.n); got != tt.class {
			t.Errorf("classOf(%d) = %d, want %d", tt.n, got, tt.class)
		}
	}
}

func TestGetPutReusesClass(t *testing.T) {
	p := New(Tracking())
	b := p.Get(3000)
	if len(*b) != 3000 || cap(*b) != 4096 {
		t.Fatalf("len %d cap %d, want 3000/4096", len(*b), cap(*b))
	}
	if p.Outstanding() != 1 {
		t.Fatalf("outstanding %d", p.Outstanding())
	}
	// gRPC may hand back a prefix; the full capacity must be reusable.
	short := (*b)[:10]
	p.Put(&short)
	if p.Outstanding() != 0 {
		t.Fatalf("outstanding %d after put", p.Outstanding())
	}
	big := p.Get(MaxPooled + 1)
	p.Put(big) // dropped, not counted
	if p.Outstanding() != 0 {
		t.Fatalf("unpooled buffer was counted")
	}
}

func TestBufferRefcount(t *testing.T) {
	p := New(Tracking())
	b := p.Alloc(100)
	b.Ref()
	b.Release()
	if p.Outstanding() != 1 {
		t.Fatal("freed while a reference was held")
	}
	b.Release()
	if p.Outstanding() != 0 {
		t.Fatal("last release did not return memory")
	}
}

func TestDoubleReleasePanics(t *testing.T) {
	p := New()
	b := p.Alloc(10)
	b.Release()
	if !Invariants {
		// Without invariants the struct may already be reused; only the
		// invariants build promises to catch a stale double release.
		t.Skip("needs -tags invariants")
	}
	mustPanic(t, "double release", b.Release)
}

func TestUseAfterFreePanics(t *testing.T) {
	if !Invariants {
		t.Skip("needs -tags invariants")
	}
	p := New()
	b := p.Alloc(10)
	b.Release()
	mustPanic(t, "use after free", func() { _ = b.Bytes() })
	mustPanic(t, "ref after free", b.Ref)
}

func TestPoisonOnPut(t *testing.T) {
	if !Invariants {
		t.Skip("needs -tags invariants")
	}
	p := New()
	b := p.Alloc(1024)
	alias := b.Bytes()
	copy(alias, "activation")
	b.Release()
	if string(alias[:10]) == "activation" {
		t.Fatal("released memory still reads as the old data")
	}
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Fatalf("%s did not panic", what)
		}
	}()
	f()
}

func BenchmarkAllocRelease(b *testing.B) {
	p := New()
	b.ReportAllocs()
	b.SetBytes(8192)
	for b.Loop() {
		p.Alloc(8192).Release()
	}
}

// A traced pool says where the buffers still out were taken, and forgets
// the ones that came back.
func TestTraceDumpsOutstanding(t *testing.T) {
	p := New(Tracking())
	p.Trace()
	kept := takeForTest(p)
	back := p.Get(1000)
	p.Put(back)
	var b strings.Builder
	if n := p.DumpOutstanding(&b); n != 1 {
		t.Fatalf("%d traced, want 1:\n%s", n, b.String())
	}
	if !strings.Contains(b.String(), "takeForTest") {
		t.Fatalf("the dump does not name the taker:\n%s", b.String())
	}
	p.Put(kept)
	b.Reset()
	if n := p.DumpOutstanding(&b); n != 0 || p.Outstanding() != 0 {
		t.Fatalf("after the last Put: %d traced, %d outstanding", n, p.Outstanding())
	}
}

//go:noinline
func takeForTest(p *Pool) *[]byte { return p.Get(4096) }

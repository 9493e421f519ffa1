package checksum

import (
	"hash/crc32"
	"math/bits"
	"math/rand/v2"
	"testing"
)

// xnmod returns x^n mod P for a CRC polynomial p given with its x^32 bit.
func xnmod(n int, p uint64) uint32 {
	r := uint64(1)
	for range n {
		r <<= 1
		if r&(1<<32) != 0 {
			r ^= p
		}
	}
	return uint32(r)
}

func foldConstant(n int, p uint64) uint64 { return uint64(bits.Reverse32(xnmod(n, p))) << 1 }

// TestFoldConstants derives the kernel's constants. The same formula must
// reproduce the IEEE constants Intel published (and Go's hash/crc32 uses), so
// the Castagnoli ones in crc32c_amd64.s are right by the same reasoning.
func TestFoldConstants(t *testing.T) {
	const ieee, castagnoli = 0x104C11DB7, 0x11EDC6F41
	tests := []struct {
		poly uint64
		n    int
		want uint64
	}{
		{ieee, 544, 0x154442bd4}, {ieee, 480, 0x1c6e41596}, {ieee, 160, 0x1751997d0}, {ieee, 96, 0x0ccaa009e},
		{castagnoli, 1056, 0x6992cea2}, {castagnoli, 992, 0x0d3b6092},
		{castagnoli, 544, 0x740eef02}, {castagnoli, 480, 0x9e4addf8}, {castagnoli, 160, 0xf20c0dfe}, {castagnoli, 96, 0x14cd00bd6},
	}
	for _, tt := range tests {
		if got := foldConstant(tt.n, tt.poly); got != tt.want {
			t.Errorf("k(%d) for %#x = %#x, want %#x", tt.n, tt.poly, got, tt.want)
		}
	}
}

// TestUpdateMatchesStdlib runs on both kernel paths (512-bit and 128-bit)
// where the CPU has them.
func TestUpdateMatchesStdlib(t *testing.T) {
	for _, avx := range []bool{haveAVX512, false} {
		saved := haveAVX512
		haveAVX512 = avx
		t.Run(map[bool]string{true: "avx512", false: "sse"}[avx], testUpdateMatchesStdlib)
		haveAVX512 = saved
	}
}

func testUpdateMatchesStdlib(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	buf := make([]byte, 9000)
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	for n := 0; n <= 5000; n++ {
		for _, off := range []int{0, 1, 7, 13} {
			p := buf[off : off+n]
			if got, want := update(0, p), crc32.Checksum(p, table); got != want {
				t.Fatalf("len %d off %d: %08x, want %08x", n, off, got, want)
			}
		}
	}
	// Incremental updates across arbitrary splits.
	for range 2000 {
		a, b := r.IntN(len(buf)), r.IntN(len(buf))
		lo, hi := min(a, b), max(a, b)
		got := update(update(0, buf[:lo]), buf[lo:hi])
		if want := crc32.Checksum(buf[:hi], table); got != want {
			t.Fatalf("split %d/%d: %08x, want %08x", lo, hi, got, want)
		}
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add([]byte("shardd"), uint32(0))
	f.Add(make([]byte, 300), uint32(0xdeadbeef))
	f.Fuzz(func(t *testing.T, p []byte, seed uint32) {
		if got, want := update(seed, p), crc32.Update(seed, table, p); got != want {
			t.Fatalf("%08x, want %08x", got, want)
		}
	})
}

// BenchmarkCRC32C compares the folding kernel with the standard library's
// CRC32C on the same 32 MiB in the same run.
func BenchmarkCRC32C(b *testing.B) {
	buf := make([]byte, 32<<20)
	for i := range buf {
		buf[i] = byte(i * 31)
	}
	b.Run("fold", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		for b.Loop() {
			update(0, buf)
		}
	})
	b.Run("stdlib", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		for b.Loop() {
			crc32.Checksum(buf, table)
		}
	})
}

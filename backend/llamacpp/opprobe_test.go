package llamacpp

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// probeShapes are the (rows, probed row) pairs each operation runs, beside
// the row alone.
var probeShapes = [][2]int{{2, 0}, {2, 1}, {3, 2}, {4, 3}, {8, 5}, {16, 0}, {17, 16}, {32, 31}, {64, 63}}

type probeCase struct {
	name   string
	op     probeOp
	wtype  int32
	layout probeLayout
	// alone: the row among others differs from the row alone; among: the
	// row differs between batches of two rows or more.
	alone, among bool
	// tiled: ggml's tiled K-quant matmul on, as the default mode runs it;
	// off (as the exact mode runs) for every other case.
	tiled bool
	// measured: the row is printed, not pinned. The product relies on
	// the invariant rows (matmul with the patch, the row-wise operations,
	// flash attention over cells in order); whether an operation shardd
	// does not use varies, or whether summing cells in another order
	// happens to round alike, depends on the CPU's kernels (AVX-512 or
	// AVX2) and is no promise.
	measured bool
}

// TestOpVariance: for each operation of the CPU forward, one row computed
// alone and among 1..31 other rows, at several places in the batch, and
// whether its bits change. The table is logged (go test -v -run
// OpVariance ./backend/llamacpp) and pinned, so a llama.cpp update that
// changes it fails here. What it shows, on this build:
//   - Matmul, every weight type: invariant. Unpatched ggml sends a matmul
//     of one row to its vec_dot path and two or more to llamafile's sgemm,
//     which rounds differently (f32, f16, bf16, and on x86 q8_0, q4_0,
//     q5_0); scripts/llama-patches/sgemm-any-rows.patch takes sgemm for any
//     number of rows, and sgemm-q4_1.patch adds q4_1 to it (on AVX2;
//     without AVX2 q4_1 takes vec_dot whatever the rows);
//     sgemm-vnni-tiles.patch computes the 4-row tiles another way and must
//     keep their bits, which 16@0 and 32@31 check; sgemm-y-q0-one-pass
//     takes other tiles for 4-8 rows of a matrix over 8 MiB and the
//     left-over rows in the same pass (the 12,288 x 768 rows). k-quants take
//     vec_dot whatever the rows while the tiled K-quant matmul
//     (cpu-tiled.patch) is off, as the exact mode keeps it; on (the
//     default mode), k-quant batches of 8 rows or more take it and round
//     otherwise (printed: where the CPU has no AVX2 it never runs).
//   - RMS norm, RoPE, softmax: invariant (row by row).
//   - Flash attention: invariant when the row's own cells are visited in
//     the same order, whether other rows' masked cells sit after them or
//     between them (a masked cell is skipped; cpu-fa-skip-hidden.patch
//     skips runs of them 16 or 32 at a time), and for a row alone among
//     512 cells it does not see. 64 rows included (64@63): October's
//     llama.cpp takes a tiled path for 64 query rows or more, which
//     rounds otherwise (256 of 256 floats) until cpu-fa-one-path.patch
//     turns it off. Not, on the CPUs measured,
//     when the row's cells come in another order (its running softmax sums
//     in cell order), which is what a KV buffer shared by sessions does to
//     a session whose later positions land in earlier cells. So the exact
//     mode gives each session a KV stream of its own, and the prefix cache
//     keeps only cells laid in position order.
//   - Attention without flash attention: varies on AVX-512 builds (its
//     mul_mats and softmax run over the whole KV range of the batch), and
//     not on some AVX2 ones; printed, not pinned. shardd turns flash
//     attention on.
//
// Pinned are the facts the product relies on, which must hold on every
// x86-64 CPU (x86-64-v2 and later); the rows marked measured are printed
// for the reader and vary by CPU.
func TestOpVariance(t *testing.T) {
	var cases []probeCase
	for _, name := range []string{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_K", "q5_K", "q6_K"} {
		cases = append(cases, probeCase{name: "matmul " + name, op: probeMatmul, wtype: probeTypes[name]})
	}
	for _, name := range []string{"q8_0", "q4_0", "q5_0"} {
		cases = append(cases, probeCase{name: "matmul " + name + ", 12,288 x 768", op: probeMatmulWide, wtype: probeTypes[name]})
	}
	for _, name := range []string{"q4_K", "q6_K"} {
		cases = append(cases, probeCase{name: "matmul " + name + ", tiled kernel on", op: probeMatmul, wtype: probeTypes[name], tiled: true, measured: true})
	}
	cases = append(cases,
		probeCase{name: "rms_norm", op: probeRMSNorm},
		probeCase{name: "rope", op: probeRope},
		probeCase{name: "softmax", op: probeSoftmax},
		probeCase{name: "attention, cells in blocks", op: probeAttn, measured: true},
		probeCase{name: "attention, cells interleaved", op: probeAttn, layout: probeInterleaved, measured: true},
		probeCase{name: "flash attention, cells in blocks", op: probeFlashAttn},
		probeCase{name: "flash attention, cells interleaved", op: probeFlashAttn, layout: probeInterleaved},
		probeCase{name: "flash attention, 512 unseen cells", op: probeFlashAttn, layout: probePadded},
		probeCase{name: "flash attention, own cells reversed", op: probeFlashAttn, layout: probeReversed, measured: true},
	)
	var table strings.Builder
	fmt.Fprintf(&table, "%-46s", "operation: differing floats vs alone")
	for _, s := range probeShapes {
		fmt.Fprintf(&table, " %5s", fmt.Sprintf("%d@%d", s[0], s[1]))
	}
	table.WriteString("\n")
	for _, c := range cases {
		for _, threads := range []int{1, 2} {
			alone := mustProbe(t, c, 1, 0, threads)
			two := mustProbe(t, c, 2, 0, threads)
			fmt.Fprintf(&table, "%-46s", fmt.Sprintf("%s, %d thread(s)", c.name, threads))
			differsAlone, differsAmong := false, false
			for _, s := range probeShapes {
				got := mustProbe(t, c, s[0], s[1], threads)
				d := differing(got, alone)
				fmt.Fprintf(&table, " %5d", d)
				differsAlone = differsAlone || d > 0
				differsAmong = differsAmong || differing(got, two) > 0
			}
			if c.measured {
				table.WriteString(" (measured, not pinned)")
			}
			table.WriteString("\n")
			if !c.measured && (differsAlone != c.alone || differsAmong != c.among) {
				t.Errorf("%s, %d threads: differs from the row alone %v (pinned %v), between batches %v (pinned %v)",
					c.name, threads, differsAlone, c.alone, differsAmong, c.among)
			}
		}
	}
	t.Logf("one row alone and among others (rows@place):\n%s", table.String())
}

func mustProbe(t *testing.T, c probeCase, n, pos, threads int) []float32 {
	t.Helper()
	var out []float32
	var err error
	withTiled(c.tiled, func() { out, err = probe(c.op, c.wtype, n, pos, c.layout, threads) })
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// differing counts the floats whose bits differ.
func differing(a, b []float32) int {
	n := 0
	for i := range a {
		if i >= len(b) || math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			n++
		}
	}
	return n
}

// TestMatmulAccuracy: every quantized matmul path gives the f32 weights'
// product within its quantization error, for one row (the decode path)
// and 16 (batched tiles), so a kernel that sums the wrong things (a tile,
// a block's scale or minimum) fails here even where route and whole model
// would agree with each other. The relative errors are logged.
func TestMatmulAccuracy(t *testing.T) {
	// About twice what this build measured (q8_0 0.005, q4_0 0.062, q4_1
	// 0.059, q5_0 0.030, q4_K 0.056, q5_K 0.028, q6_K 0.014).
	limit := map[string]float64{"q8_0": 0.01, "q4_0": 0.12, "q4_1": 0.12, "q5_0": 0.06, "q4_K": 0.11, "q5_K": 0.06, "q6_K": 0.03}
	for _, rows := range []int{1, 16} {
		want, err := probe(probeMatmul, probeTypes["f32"], rows, rows/2, probeBlocks, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"q8_0", "q4_0", "q4_1", "q5_0", "q4_K", "q5_K", "q6_K"} {
			modes := []bool{false}
			if strings.HasSuffix(name, "_K") { // the tiled kernel takes only K-quants
				modes = append(modes, true)
			}
			for _, tiled := range modes {
				var got []float32
				withTiled(tiled, func() { got, err = probe(probeMatmul, probeTypes[name], rows, rows/2, probeBlocks, 1) })
				if err != nil {
					t.Fatal(err)
				}
				var diff, norm float64
				for i := range want {
					d := float64(got[i] - want[i])
					diff += d * d
					norm += float64(want[i]) * float64(want[i])
				}
				rel := math.Sqrt(diff / norm)
				t.Logf("%s, %d rows, tiled %v: relative error %.4f", name, rows, tiled, rel)
				if !(rel < limit[name]) {
					t.Errorf("%s, %d rows, tiled %v: relative error %.4f against f32 weights, above %.2f", name, rows, tiled, rel, limit[name])
				}
			}
		}
	}
}

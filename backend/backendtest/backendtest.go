// Package backendtest has a test double of the compute backend whose
// forward takes a fixed time, and a helper that serves a route of them on
// loopback with the real engine and gRPC. Tests only: the shipped daemon
// always runs llama.cpp.
package backendtest

import (
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/engine"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
)

// Delay is a backend whose every Forward takes Delay (whatever the batch)
// and whose outputs are a deterministic function of the rows: a token
// row's logits peak at (token + pos) mod Vocab.
type Delay struct {
	info  backend.Info
	Delay time.Duration
	pos   map[int]int // next position per sequence
	buf   []float32
}

// NewDelay returns a Delay for a shard that holds the first and/or last
// layer.
func NewDelay(first, last bool, d time.Duration) *Delay {
	return &Delay{Delay: d, pos: map[int]int{}, info: backend.Info{TokensIn: first, LogitsOut: last, Hidden: 16, Vocab: 64,
		Layers: 1, MaxSeqs: 64, CtxTokens: 1 << 16, MaxBatch: 512, Threads: 1, Name: "delay-test", Device: "test"}}
}

type row struct {
	seq, pos int
	val      float32
	out      bool
}

type batch struct {
	rows []row
	max  int
	outs int
}

func (d *Delay) Info() backend.Info { return d.info }
func (d *Delay) NewBatch() (backend.Batch, error) {
	return &batch{max: d.info.MaxBatch}, nil
}
func (d *Delay) FreeBatch(backend.Batch) {}
func (d *Delay) Close() error            { return nil }

func (d *Delay) SeqTrim(seq, from int) error {
	if d.pos[seq] > from {
		d.pos[seq] = from
	}
	return nil
}

// Forward sleeps Delay, then checks positions and fills the outputs.
func (d *Delay) Forward(bb backend.Batch, out *backend.Output) error {
	time.Sleep(d.Delay)
	b := bb.(*batch)
	for _, r := range b.rows {
		if d.pos[r.seq] != r.pos {
			return fmt.Errorf("%w: seq %d at %d, row at %d", backend.ErrPosition, r.seq, d.pos[r.seq], r.pos)
		}
		d.pos[r.seq]++
	}
	out.Logits, d.buf = out.Logits[:0], d.buf[:0]
	for _, r := range b.rows {
		switch {
		case d.info.LogitsOut && r.out:
			peak := (int(r.val) + r.pos) % d.info.Vocab
			for v := range d.info.Vocab {
				l := float32(0)
				if v == peak {
					l = 1
				}
				out.Logits = append(out.Logits, l)
			}
		case !d.info.LogitsOut:
			for range d.info.Hidden {
				d.buf = append(d.buf, r.val)
			}
		}
	}
	out.Hidden = d.buf
	return nil
}

func (b *batch) add(seq, pos int, v float32, out bool) error {
	if len(b.rows) >= b.max {
		return backend.ErrBatchFull
	}
	b.rows = append(b.rows, row{seq, pos, v, out})
	if out {
		b.outs++
	}
	return nil
}

func (b *batch) AddToken(seq, pos int, tok int32, out bool) error {
	return b.add(seq, pos, float32(tok), out)
}

func (b *batch) AddHiddenBF16(seq, pos int, r []byte, out bool) error {
	return b.add(seq, pos, bf16(uint16(r[0])|uint16(r[1])<<8), out)
}

func (b *batch) AddHiddenF32(seq, pos int, r []float32, out bool) error {
	return b.add(seq, pos, r[0], out)
}

func bf16(v uint16) float32 { return math.Float32frombits(uint32(v) << 16) }

func (b *batch) Len() int     { return len(b.rows) }
func (b *batch) Outputs() int { return b.outs }
func (b *batch) Reset()       { b.rows, b.outs = b.rows[:0], 0 }

// ServeRoute serves a route of n Delay shards (one layer each) with the
// real engine over gRPC on loopback and returns the workers' addresses in
// layer order. Everything stops when the test ends.
func ServeRoute(t testing.TB, n int, d time.Duration, cfg engine.Config) []string {
	t.Helper()
	var addrs []string
	for i := range n {
		be := NewDelay(i == 0, i == n-1, d)
		meta := gguf.Meta{Arch: "llama", BlockCount: 1, Start: i, End: i + 1, Total: n, FileType: "f32",
			SourceDigest: "00000000000000000000000000000000000000000000000000000000000000aa"}
		eng := engine.New(cfg, be, meta, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if eng.State() != shardv1.ServingState_SERVING_STATE_SERVING {
			t.Fatalf("backendtest: shard %d is not serving", i)
		}
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(eng.ServerOptions()...)
		shardv1.RegisterShardRuntimeServer(srv, eng)
		go srv.Serve(lis)
		t.Cleanup(func() {
			srv.Stop()
			eng.Close()
		})
		addrs = append(addrs, lis.Addr().String())
	}
	return addrs
}

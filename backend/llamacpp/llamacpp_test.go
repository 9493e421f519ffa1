package llamacpp

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/meshnet/shardd/backend"
	"github.com/meshnet/shardd/gguf"
)

var (
	tinyOnce  sync.Once
	tinyDir   string
	tinyPaths []string
	tinyErr   error
)

// tinyShards returns the tiny model and its 3-way split, made once per run.
func tinyShards(t testing.TB) (string, []string) {
	t.Helper()
	tinyOnce.Do(func() {
		tinyDir, tinyErr = os.MkdirTemp("", "shardd-llamacpp-test-")
		if tinyErr != nil {
			return
		}
		model := filepath.Join(tinyDir, "tiny.gguf")
		if tinyErr = gguf.Generate(model, gguf.Presets["tiny"]); tinyErr != nil {
			return
		}
		tinyPaths, tinyErr = gguf.Split(model, gguf.EvenRanges(6, 3), tinyDir, nil)
	})
	if tinyErr != nil {
		t.Fatal(tinyErr)
	}
	return filepath.Join(tinyDir, "tiny.gguf"), tinyPaths
}

func TestMain(m *testing.M) {
	code := m.Run()
	if tinyDir != "" {
		os.RemoveAll(tinyDir)
	}
	os.Exit(code)
}

func open(t testing.TB, path string) *Backend {
	t.Helper()
	b, err := Open(Config{Path: path, Threads: 2, MaxSeqs: 4, CtxTokens: 128, MaxBatch: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestRolesAndProbe(t *testing.T) {
	model, shards := tinyShards(t)
	tests := []struct {
		path              string
		tokensIn, logits  bool
		layers, vocabSize int
	}{
		{model, true, true, 6, 512},
		{shards[0], true, false, 2, 512},
		{shards[1], false, false, 2, 1},
		{shards[2], false, true, 2, 512},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			b := open(t, tt.path)
			info := b.Info()
			if info.TokensIn != tt.tokensIn || info.LogitsOut != tt.logits || info.Layers != tt.layers || info.Vocab != tt.vocabSize || info.Hidden != 128 {
				t.Fatalf("info %+v", info)
			}
			if err := backend.Probe(b); err != nil {
				t.Fatal(err)
			}
			// The probe frees its sequence: a fresh start at position 0 works.
			if err := backend.Probe(b); err != nil {
				t.Fatalf("second probe: %v", err)
			}
		})
	}
}

func TestBatchRefusals(t *testing.T) {
	_, shards := tinyShards(t)
	first, middle := open(t, shards[0]), open(t, shards[1])
	fb, _ := first.NewBatch()
	defer first.FreeBatch(fb)
	mb, _ := middle.NewBatch()
	defer middle.FreeBatch(mb)

	if err := fb.AddHiddenF32(0, 0, make([]float32, 128), true); !errors.Is(err, backend.ErrInput) {
		t.Errorf("hidden row into a token shard: %v", err)
	}
	if err := mb.AddToken(0, 0, 1, true); !errors.Is(err, backend.ErrInput) {
		t.Errorf("token into a hidden shard: %v", err)
	}
	if err := fb.AddToken(0, 0, 512, true); !errors.Is(err, backend.ErrInput) {
		t.Errorf("token past the vocabulary: %v", err)
	}
	if err := fb.AddToken(9, 0, 1, true); !errors.Is(err, backend.ErrInput) {
		t.Errorf("sequence past MaxSeqs: %v", err)
	}
	if err := mb.AddHiddenBF16(0, 0, make([]byte, 10), true); !errors.Is(err, backend.ErrInput) {
		t.Errorf("short hidden row: %v", err)
	}
	for i := range 8 {
		if err := fb.AddToken(0, i, 1, false); err != nil {
			t.Fatal(err)
		}
	}
	if fb.Outputs() != 8 {
		t.Errorf("a hidden-producing shard must flag every row, got %d outputs", fb.Outputs())
	}
	if err := fb.AddToken(0, 8, 1, false); !errors.Is(err, backend.ErrBatchFull) {
		t.Errorf("ninth row: %v", err)
	}
}

func TestPositionGapRefused(t *testing.T) {
	model, _ := tinyShards(t)
	b := open(t, model)
	bt, _ := b.NewBatch()
	defer b.FreeBatch(bt)
	var out backend.Output
	bt.AddToken(0, 0, 1, true)
	if err := b.Forward(bt, &out); err != nil {
		t.Fatal(err)
	}
	bt.Reset()
	bt.AddToken(0, 5, 1, true) // skips positions 1..4
	if err := b.Forward(bt, &out); !errors.Is(err, backend.ErrPosition) {
		t.Fatalf("gap: %v", err)
	}
	// Rewinding to 0 and starting again is fine.
	if err := b.SeqTrim(0, 0); err != nil {
		t.Fatal(err)
	}
	bt.Reset()
	bt.AddToken(0, 0, 1, true)
	if err := b.Forward(bt, &out); err != nil || len(out.Logits) != 512 {
		t.Fatalf("after rewind: %v, %d logits", err, len(out.Logits))
	}
}

func TestOpenRefusesBadFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.gguf")
	os.WriteFile(bad, []byte("GGUF but not really"), 0o644)
	if _, err := Open(Config{Path: bad}); !errors.Is(err, gguf.ErrBadFile) {
		t.Fatalf("got %v", err)
	}
}

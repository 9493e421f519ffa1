package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/ollama/ollama/fs/ggml"
)

// Range is a half-open layer range [Start, End).
type Range struct{ Start, End int }

func (r Range) String() string { return fmt.Sprintf("%d:%d", r.Start, r.End) }

// ParseRanges parses "0:6,6:12".
func ParseRanges(s string) ([]Range, error) {
	var out []Range
	for part := range strings.SplitSeq(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(part), ":")
		lo, err1 := strconv.Atoi(a)
		hi, err2 := strconv.Atoi(b)
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("gguf: bad range %q (want START:END)", part)
		}
		out = append(out, Range{lo, hi})
	}
	return out, nil
}

// EvenRanges splits n layers into k contiguous ranges of near-equal size.
func EvenRanges(n, k int) []Range {
	out := make([]Range, 0, k)
	for i := range k {
		out = append(out, Range{i * n / k, (i + 1) * n / k})
	}
	return out
}

// CheckRanges requires ranges that are non-empty and inside [0, total).
// Overlap is allowed (the control plane resolves it with
// effective_start_layer); a gap is not checked here either, since a route
// may be built from shards of several splits.
func CheckRanges(rs []Range, total int) error {
	if len(rs) == 0 {
		return errors.New("gguf: no ranges")
	}
	for _, r := range rs {
		if r.Start < 0 || r.End <= r.Start || r.End > total {
			return fmt.Errorf("gguf: range %s outside the model's %d layers", r, total)
		}
	}
	return nil
}

// ShardPath is where Split writes range r of src: "<outDir>/<base>.<s>-<e>.gguf".
func ShardPath(src, outDir string, r Range) string {
	base := strings.TrimSuffix(filepath.Base(src), ".gguf")
	return filepath.Join(outDir, fmt.Sprintf("%s.%d-%d.gguf", base, r.Start, r.End))
}

// Progress is told bytes copied so far out of the total.
type Progress func(done, total int64)

// Split writes one GGUF per range of the whole model src into outDir and
// returns their paths in range order.
func Split(src string, ranges []Range, outDir string, progress Progress) ([]string, error) {
	meta, err := Read(src)
	if err != nil {
		return nil, err
	}
	if meta.IsShard {
		return nil, fmt.Errorf("gguf: %s is already a shard (%d:%d); split the whole model", filepath.Base(src), meta.Start, meta.End)
	}
	if err := CheckRanges(ranges, meta.BlockCount); err != nil {
		return nil, err
	}
	if err := meta.CheckAlign(ranges); err != nil {
		return nil, err
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	g, err := ggml.Decode(f, -1)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadFile, err)
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}

	var total int64
	plans := make([][]*ggml.Tensor, len(ranges))
	kvs := make([]ggml.KV, len(ranges))
	for i, r := range ranges {
		kvs[i], plans[i], err = planShard(g, meta, r, f)
		if err != nil {
			return nil, err
		}
		for _, t := range plans[i] {
			if _, ok := t.WriterTo.(*sectionWriter); ok {
				total += int64(t.Size())
			}
		}
	}
	var done atomic.Int64
	if progress != nil {
		// WriteGGUF writes tensors concurrently; report from one at a time.
		var mu sync.Mutex
		inner := progress
		progress = func(d, t int64) {
			mu.Lock()
			defer mu.Unlock()
			inner(d, t)
		}
	}
	paths := make([]string, len(ranges))
	for i, r := range ranges {
		for _, t := range plans[i] {
			if w, ok := t.WriterTo.(*sectionWriter); ok {
				w.done, w.total, w.progress = &done, total, progress
			}
		}
		paths[i] = ShardPath(src, outDir, r)
		if err := writeFile(paths[i], kvs[i], plans[i]); err != nil {
			return nil, err
		}
	}
	return paths, nil
}

func writeFile(path string, kv ggml.KV, ts []*ggml.Tensor) error {
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := ggml.WriteGGUF(out, kv, ts); err != nil {
		out.Close()
		os.Remove(path)
		return fmt.Errorf("gguf: write %s: %w", filepath.Base(path), err)
	}
	return out.Close()
}

// planShard builds the metadata and tensor list of one shard.
func planShard(g *ggml.GGML, meta Meta, r Range, f *os.File) (ggml.KV, []*ggml.Tensor, error) {
	first, last := r.Start == 0, r.End == meta.BlockCount
	middle := !first && !last
	kv := ggml.KV{}
	for k, v := range g.KV() {
		if middle && strings.HasPrefix(k, "tokenizer.") {
			continue
		}
		cv, err := convertValue(v)
		if err != nil {
			return nil, nil, fmt.Errorf("gguf: key %s: %w", k, err)
		}
		kv[k] = cv
	}
	arch := meta.Arch
	kv[arch+".block_count"] = uint32(r.End - r.Start)
	kv[KeySourceDigest] = meta.SourceDigest
	kv[KeyStartLayer] = uint32(r.Start)
	kv[KeyEndLayer] = uint32(r.End)
	kv[KeyTotalLayers] = uint32(meta.BlockCount)
	kv[KeySourceWeights] = meta.FileType
	if middle {
		kv["tokenizer.ggml.model"] = "none"
		kv[arch+".vocab_size"] = uint32(1)
	}

	ts := g.Tensors()
	var out []*ggml.Tensor
	for _, t := range ts.Items() {
		name := t.Name
		if rest, ok := strings.CutPrefix(name, "blk."); ok {
			num, suffix, _ := strings.Cut(rest, ".")
			i, err := strconv.Atoi(num)
			if err != nil {
				return nil, nil, fmt.Errorf("gguf: tensor %q has a bad block number", name)
			}
			if i < r.Start || i >= r.End {
				continue
			}
			name = fmt.Sprintf("blk.%d.%s", i-r.Start, suffix)
		} else if middle && (name == "token_embd.weight" || name == "output_norm.weight" || name == "output.weight") {
			continue // replaced by placeholders below
		} else if first && !last && name == "output.weight" {
			continue // the first shard never computes the head
		}
		out = append(out, &ggml.Tensor{
			Name: name, Kind: t.Kind, Shape: t.Shape,
			WriterTo: &sectionWriter{r: io.NewSectionReader(f, int64(ts.Offset+t.Offset), int64(t.Size()))},
		})
	}
	if middle {
		h := uint64(meta.EmbeddingLen)
		out = append(out,
			constTensor("token_embd.weight", []uint64{h, 1}, 0),
			constTensor("output_norm.weight", []uint64{h}, 1))
	}
	return kv, out, nil
}

// sectionWriter copies one tensor's bytes from the source file and reports
// progress.
type sectionWriter struct {
	r        *io.SectionReader
	done     *atomic.Int64
	total    int64
	progress Progress
}

func (s *sectionWriter) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, 1<<20)
	var n int64
	for {
		m, err := s.r.Read(buf)
		if m > 0 {
			if _, werr := w.Write(buf[:m]); werr != nil {
				return n, werr
			}
			n += int64(m)
			if s.done != nil {
				d := s.done.Add(int64(m))
				if s.progress != nil {
					s.progress(d, s.total)
				}
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// constTensor is an f32 tensor filled with v.
func constTensor(name string, shape []uint64, v float32) *ggml.Tensor {
	n := uint64(1)
	for _, d := range shape {
		n *= d
	}
	return &ggml.Tensor{Name: name, Kind: uint32(ggml.TensorTypeF32), Shape: shape,
		WriterTo: writerFunc(func(w io.Writer) (int64, error) {
			b := make([]byte, 4*n)
			for i := range n {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
			}
			m, err := w.Write(b)
			return int64(m), err
		})}
}

// convertValue maps metadata values to types WriteGGUF accepts: it rejects
// 8/16-bit integers and float64, scalar or array.
func convertValue(v any) (any, error) {
	switch v := v.(type) {
	case uint8:
		return uint32(v), nil
	case uint16:
		return uint32(v), nil
	case int8:
		return int32(v), nil
	case int16:
		return int32(v), nil
	case float64:
		return float32(v), nil
	case uint32, int32, uint64, int64, float32, bool, string, ggml.FileType:
		return v, nil
	}
	// Arrays come from the decoder as *array[T] with an unexported values
	// slice; read it through reflection.
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("unsupported value type %T", v)
	}
	vals := rv.Elem().FieldByName("values")
	if !vals.IsValid() || vals.Kind() != reflect.Slice {
		return nil, fmt.Errorf("unsupported value type %T", v)
	}
	n := vals.Len()
	switch vals.Type().Elem().Kind() {
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		out := make([]uint32, n)
		for i := range n {
			out[i] = uint32(vals.Index(i).Uint())
		}
		return out, nil
	case reflect.Int8, reflect.Int16, reflect.Int32:
		out := make([]int32, n)
		for i := range n {
			out[i] = int32(vals.Index(i).Int())
		}
		return out, nil
	case reflect.Int64:
		out := make([]int64, n)
		for i := range n {
			out[i] = vals.Index(i).Int()
		}
		return out, nil
	case reflect.Float32, reflect.Float64:
		out := make([]float32, n)
		for i := range n {
			out[i] = float32(vals.Index(i).Float())
		}
		return out, nil
	case reflect.String:
		out := make([]string, n)
		for i := range n {
			out[i] = vals.Index(i).String()
		}
		return out, nil
	case reflect.Bool:
		out := make([]bool, n)
		for i := range n {
			out[i] = vals.Index(i).Bool()
		}
		return out, nil
	}
	return nil, fmt.Errorf("unsupported array type %T", v)
}

// Package receive composes the receive stages for one named tensor:
// reassemble -> decompress -> checksum. See package stages for the picture.
package receive

import (
	"time"

	"github.com/meshnet/shardd/bufpool"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/stages"
	"github.com/meshnet/shardd/stages/checksum"
	"github.com/meshnet/shardd/stages/decompress"
	"github.com/meshnet/shardd/stages/reassemble"
)

// Config is the receive policy of one worker.
type Config struct {
	Budget   reassemble.Budget
	Checksum checksum.Policy
}

// Pipeline runs the receive stages. It is safe for concurrent use; each
// caller brings its own stages.Tensor.
type Pipeline struct {
	cfg  Config
	pool *bufpool.Pool
	dec  *decompress.Decompressor
}

// New returns a pipeline drawing buffers from pool.
func New(cfg Config, pool *bufpool.Pool) *Pipeline {
	return &Pipeline{cfg: cfg, pool: pool, dec: decompress.New(pool, cfg.Budget.MaxTensorBytes)}
}

// Close releases the decompressor.
func (p *Pipeline) Close() { p.dec.Close() }

// Pool is the buffer pool the pipeline draws from.
func (p *Pipeline) Pool() *bufpool.Pool { return p.pool }

// Tensor validates nt into t. zstdAccepted says whether the session
// negotiated zstd. On success t holds the uncompressed, verified body; the
// caller Resets t when done. On error t has been Reset.
func (p *Pipeline) Tensor(t *stages.Tensor, nt *shardv1.NamedTensor, zstdAccepted bool) error {
	return p.TensorTimed(t, nt, zstdAccepted, nil)
}

// Timings are when each stage ended, for tracing; Start is when the first
// began.
type Timings struct {
	Start, Reassembled, Decompressed, Checked time.Time
}

// TensorTimed is Tensor that records stage boundaries in tm (when not nil).
func (p *Pipeline) TensorTimed(t *stages.Tensor, nt *shardv1.NamedTensor, zstdAccepted bool, tm *Timings) error {
	if tm != nil {
		tm.Start = time.Now()
	}
	if err := reassemble.Into(t, nt, p.cfg.Budget); err != nil {
		t.Reset()
		return err
	}
	if tm != nil {
		tm.Reassembled = time.Now()
	}
	if err := p.dec.Into(t, zstdAccepted); err != nil {
		t.Reset()
		return err
	}
	if tm != nil {
		tm.Decompressed = time.Now()
	}
	if err := checksum.Verify(t.Checksum, t.Segments(), p.cfg.Checksum); err != nil {
		t.Reset()
		return err
	}
	if tm != nil {
		tm.Checked = time.Now()
	}
	return nil
}

// Package receive composes the receive stages for one named tensor:
// reassemble -> decompress -> checksum. See package stages for the picture.
package receive

import (
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
	if err := reassemble.Into(t, nt, p.cfg.Budget); err != nil {
		t.Reset()
		return err
	}
	if err := p.dec.Into(t, zstdAccepted); err != nil {
		t.Reset()
		return err
	}
	if err := checksum.Verify(t.Checksum, t.Segments(), p.cfg.Checksum); err != nil {
		t.Reset()
		return err
	}
	return nil
}

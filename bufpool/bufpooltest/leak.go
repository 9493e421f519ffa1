// Package bufpooltest holds test helpers for code that uses bufpool.
package bufpooltest

import (
	"testing"

	"github.com/meshnet/shardd/bufpool"
)

// New returns a tracking pool whose outstanding buffers fail t when the test
// ends.
func New(t testing.TB) *bufpool.Pool {
	t.Helper()
	p := bufpool.New(bufpool.Tracking())
	t.Cleanup(func() {
		if n := p.Outstanding(); n != 0 {
			t.Errorf("bufpool: %d pooled buffer(s) leaked", n)
		}
	})
	return p
}

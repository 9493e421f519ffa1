// Package bufpooltest holds test helpers for code that uses bufpool.
package bufpooltest

import "github.com/meshnet/shardd/bufpool"

// T is the part of testing.TB that New uses.
type T interface {
	Helper()
	Cleanup(func())
	Errorf(format string, args ...any)
}

// New returns a tracking pool whose outstanding buffers fail t when the test
// ends.
func New(t T) *bufpool.Pool {
	t.Helper()
	p := bufpool.New(bufpool.Tracking())
	t.Cleanup(func() {
		if n := p.Outstanding(); n != 0 {
			t.Errorf("bufpool: %d pooled buffer(s) leaked", n)
		}
	})
	return p
}

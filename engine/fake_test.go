package engine

import (
	"testing"

	"github.com/meshnet/shardd/backend/backendtest"
	"github.com/meshnet/shardd/gguf"
)

// The engine's tests use the shared test double (backend/backendtest).
type (
	fakeBackend     = backendtest.Fake
	preemptibleFake = backendtest.Preemptible
)

func newFake(first, last bool) *fakeBackend { return backendtest.New(first, last) }

// fakeMeta is metadata consistent with a fake backend.
func fakeMeta() gguf.Meta {
	return gguf.Meta{Arch: "llama", BlockCount: 1, Start: 0, End: 1, Total: 1, FileType: "f32",
		SourceDigest: "0000000000000000000000000000000000000000000000000000000000000000"}
}

// callsSeen copies f.Calls on the scheduler goroutine (which appends to it).
func callsSeen(t testing.TB, e *Engine, f *fakeBackend) []map[int]int {
	var out []map[int]int
	waitFor(t, e, func() bool { out = append(out, f.Calls...); return true })
	return out
}

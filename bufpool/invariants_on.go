//go:build invariants

package bufpool

// Invariants reports whether the costly ownership checks are compiled in.
const Invariants = true

// With invariants, Buffer structs are never reused, so a stale pointer keeps
// refs == 0 and every later use panics instead of touching a new owner's data.
func newBufferStruct() *Buffer      { return new(Buffer) }
func recycleBufferStruct(b *Buffer) { b.refs.Store(0) }

func checkLive(b *Buffer) {
	if b.refs.Load() <= 0 || b.data == nil {
		panic("bufpool: use of a released buffer")
	}
}

// poison overwrites released memory so a reader holding an aliased slice sees
// garbage that fails checksums loudly rather than plausible stale data.
func poison(p []byte) {
	for i := range p {
		p[i] = 0xDB
	}
}

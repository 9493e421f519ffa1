//go:build !invariants

package bufpool

// Invariants reports whether the costly ownership checks are compiled in.
const Invariants = false

func newBufferStruct() *Buffer {
	b := bufferStructs.Get().(*Buffer)
	return b
}

func recycleBufferStruct(b *Buffer) { bufferStructs.Put(b) }

func checkLive(*Buffer) {}

func poison([]byte) {}

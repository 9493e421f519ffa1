package bufpool

import (
	"sync"
	"sync/atomic"
)

// Buffer is a reference-counted byte buffer drawn from a Pool.
type Buffer struct {
	refs atomic.Int32
	data *[]byte
	pool *Pool
}

var bufferStructs = sync.Pool{New: func() any { return new(Buffer) }}

// Alloc returns a Buffer of length n holding one reference owned by the
// caller, who must Release it.
func (p *Pool) Alloc(n int) *Buffer {
	b := newBufferStruct()
	b.data = p.Get(n)
	b.pool = p
	b.refs.Store(1)
	return b
}

// Bytes returns the buffer's memory. It is valid until the caller's
// reference is released; writing is allowed only to the owner that
// allocated it, before it shares the buffer.
func (b *Buffer) Bytes() []byte {
	checkLive(b)
	return *b.data
}

// Len is the length of the buffer.
func (b *Buffer) Len() int { return len(b.Bytes()) }

// SetLen sets the visible length to n, within the buffer's capacity:
// shorter, or longer after the owner appended to Bytes() in place.
func (b *Buffer) SetLen(n int) {
	checkLive(b)
	*b.data = (*b.data)[:n]
}

// Ref adds a reference for another holder, who must Release it.
func (b *Buffer) Ref() {
	if b.refs.Add(1) <= 1 {
		panic("bufpool: Ref of a released buffer")
	}
}

// Release drops one reference; the last returns the memory to its pool. A
// release beyond the references held panics.
func (b *Buffer) Release() {
	switch n := b.refs.Add(-1); {
	case n > 0:
		return
	case n < 0:
		panic("bufpool: double release")
	}
	b.pool.Put(b.data)
	b.data, b.pool = nil, nil
	recycleBufferStruct(b)
}

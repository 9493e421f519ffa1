//go:build !amd64

package argmax

// haveAVX2: the vector kernels are amd64 only.
const haveAVX2 = false

func index(v []float32) int32 { return indexGo(v) }

//go:build !amd64

package checksum

const haveCLMUL = false

func foldCLMUL(crc uint32, p []byte) uint32 { panic("checksum: no CLMUL kernel on this architecture") }

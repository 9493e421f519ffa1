package checksum

import "golang.org/x/sys/cpu"

// haveCLMUL: the folding kernel needs PCLMULQDQ, SSE4.1 (PEXTRQ) and SSE4.2
// (CRC32).
var haveCLMUL = cpu.X86.HasPCLMULQDQ && cpu.X86.HasSSE41 && cpu.X86.HasSSE42

// haveAVX512 selects the kernel's 512-bit path; read by crc32c_amd64.s.
var haveAVX512 = haveCLMUL && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VPCLMULQDQ

// foldCLMUL is implemented in crc32c_amd64.s.
//
//go:noescape
func foldCLMUL(crc uint32, p []byte) uint32

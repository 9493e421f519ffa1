// Package bufpool provides the size-classed, reference-counted byte buffers
// that the receive and send paths share.
//
// A Pool implements grpc-go's mem.BufferPool, so one pool serves gRPC's own
// receive buffers and the project's reassembly, decompression and conversion
// buffers. Buffers come in power-of-two size classes from 512 B to 64 MiB; a
// request above the largest class is allocated directly and never pooled.
//
// Ownership: Alloc returns a *Buffer holding one reference, owned by the
// caller. Ref adds a reference for another holder; every holder calls Release
// exactly once. The last Release returns the memory to the pool, after which
// the Buffer must not be touched.
//
// Checks: double release panics in every build. Built with the `invariants`
// tag (the test run turns it on), Buffer structs are never reused, released
// memory is poisoned, and Bytes on a released Buffer panics, so a use after
// free is caught where it happens. A Pool made with Tracking counts
// outstanding buffers so a test can fail on a leak (see CheckLeaks).
package bufpool

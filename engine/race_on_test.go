//go:build race

package engine

// raceBuild: built with -race, where sync.Pool drops some of what it is
// given on purpose and the detector allocates, so counts of allocations
// are only rough.
const raceBuild = true

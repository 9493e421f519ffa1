//go:build race

package engine

// raceBuild: built with -race, where sync.Pool drops some of what it is
// given on purpose, so counts of allocations mean nothing.
const raceBuild = true

// Package race says whether the race detector is on, for tests that choose
// where they run.
package race

// T is the part of testing.TB that Numeric uses.
type T interface {
	Helper()
	Skip(args ...any)
}

// Numeric marks a test that compares a forward's numbers through llama.cpp
// (real models, every architecture): under -race it takes about twice as
// long and checks no concurrency that the race pass's other tests do not,
// so it is skipped there and `make unit` runs it in its pass without
// -race.
func Numeric(t T) {
	t.Helper()
	if Enabled {
		t.Skip("a numeric test: make unit runs it in the pass without -race")
	}
}

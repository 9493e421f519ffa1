//go:build race

package main

// raceBuild: this test binary was built with -race; a binary the tests
// build is built the same way, so it reuses the compiled llama.cpp.
const raceBuild = true

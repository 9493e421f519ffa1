package main

import (
	"strings"
	"testing"

	"github.com/meshnet/shardd/verify"
)

// `shardd verify` passes a tiny model whose bf16 rounding flips a greedy
// token against the unrounded model (seeds 3 and 7 of the preset, see
// package verify) the same way, and fails,
// naming the row, when one boundary value crosses one bf16 ulp off.
func TestVerifyCommand(t *testing.T) {
	dir := t.TempDir()
	model := tinyModel(t, dir)
	if err := runVerify([]string{"--model", model, "--shards", "2,3", "--threads", "1"}); err != nil {
		t.Fatalf("verify of a sound split: %v", err)
	}
	crossed := 0
	verify.Corrupt = func(hidden []byte) {
		if crossed++; crossed == 3 {
			hidden[0] ^= 1
		}
	}
	defer func() { verify.Corrupt = nil }()
	err := runVerify([]string{"--model", model, "--shards", "2", "--threads", "1"})
	if err == nil || !strings.Contains(err.Error(), "from logit row") || !strings.Contains(err.Error(), "bf16") {
		t.Fatalf("verify with one value one ulp off: %v", err)
	}
	t.Log(err)
}

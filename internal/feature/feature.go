// Package feature names the optional behaviours of the Shard data plane
// that a worker may understand beyond the contract's required messages,
// and how a worker advertises them: in its CapabilityReport's detail, the
// report's free text, as one clause "features: a b c". A head sends an
// optional tensor only to a worker that advertises it, so a head and a
// worker of different releases work together (README: Upgrading a fleet).
//
// A worker of a release before this advertisement advertises nothing, and
// a head treats it as understanding none of them: the behaviour of that
// release's head.
package feature

import (
	"slices"
	"strings"
)

// The optional behaviours, each named for the tensor that asks for it.
const (
	// SessionTokens: the first prefill chunk's session_tokens tensor, the
	// length the session will reach, reserved at admission.
	SessionTokens = "session_tokens"
	// LogitsTopK: the logits_top_k tensor, asking the last shard for the
	// best K logits of a row and their ids instead of the whole row.
	LogitsTopK = "logits_top_k"
)

// All are the behaviours this release understands.
var All = []string{SessionTokens, LogitsTopK}

// clause starts the advertisement within the detail text.
const clause = "features:"

// Set is the behaviours one worker advertises.
type Set []string

// Has reports whether the set holds name.
func (s Set) Has(name string) bool { return slices.Contains(s, name) }

// Advertise appends the clause for set to detail (the report's detail:
// empty when the worker is validated, a reason when not).
func Advertise(detail string, set Set) string {
	c := clause + " " + strings.Join(set, " ")
	if len(set) == 0 {
		c = clause + " none"
	}
	if detail == "" {
		return c
	}
	return detail + "; " + c
}

// Parse reads the advertised set from a report's detail; none when it has
// no clause (a worker from before the advertisement).
func Parse(detail string) Set {
	i := strings.LastIndex(detail, clause)
	if i < 0 {
		return nil
	}
	var out Set
	for _, f := range strings.Fields(detail[i+len(clause):]) {
		f = strings.TrimSuffix(f, ";")
		if f != "none" && f != "" {
			out = append(out, f)
		}
	}
	return out
}

// Without is All less the names in withheld.
func Without(withheld []string) Set {
	var out Set
	for _, f := range All {
		if !slices.Contains(withheld, f) {
			out = append(out, f)
		}
	}
	return out
}

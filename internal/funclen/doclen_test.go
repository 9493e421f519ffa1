package funclen

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// docLimits are the most lines the top-level documents may have: README
// says what shardd is and how to use it, PERF.md where performance stands
// now (the story is git history and the issues' notes; docs/ holds the
// operators' guides).
var docLimits = map[string]int{"README.md": 400, "PERF.md": 700}

// TestDocLength fails for a top-level document over its limit.
func TestDocLength(t *testing.T) {
	for name, most := range docLimits {
		b, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte("\n")); n > most {
			t.Errorf("%s: %d lines (limit %d): move detail to docs/, history to git", name, n, most)
		}
	}
}

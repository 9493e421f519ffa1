package feature

import (
	"slices"
	"testing"
)

func TestAdvertiseParse(t *testing.T) {
	for _, c := range []struct {
		detail string
		set    Set
	}{
		{"", All},
		{"capability probe failed", Set{LogitsTopK}},
		{"", nil},
	} {
		got := Parse(Advertise(c.detail, c.set))
		if !slices.Equal(got, c.set) {
			t.Errorf("advertised %v in %q, parsed %v", c.set, Advertise(c.detail, c.set), got)
		}
	}
	if Parse("capability probe failed") != nil || Parse("") != nil {
		t.Fatal("a detail without the clause advertised something")
	}
	if w := Without([]string{SessionTokens}); !slices.Equal(w, Set{LogitsTopK}) || w.Has(SessionTokens) {
		t.Fatalf("without session_tokens: %v", w)
	}
}

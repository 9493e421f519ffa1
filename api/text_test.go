package api

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Pieces become text: whole characters only, no part of a stop string,
// and the same text however the bytes were cut into pieces.
func TestTextOut(t *testing.T) {
	emoji, cjk := "🌱", "晨" // 4 and 3 bytes
	cases := []struct {
		name   string
		pieces []string
		stops  []string
		sent   []string // per piece
		final  string   // flush, when no stop string was found
		stop   bool
	}{
		{name: "ascii", pieces: []string{"a", "b"}, sent: []string{"a", "b"}},
		{name: "emoji in four pieces", pieces: []string{emoji[:1], emoji[1:2], emoji[2:3], emoji[3:] + "!"},
			sent: []string{"", "", "", emoji + "!"}},
		{name: "cjk across two", pieces: []string{"x" + cjk[:2], cjk[2:]}, sent: []string{"x", cjk}},
		{name: "ends inside a character", pieces: []string{"ok" + emoji[:2]}, sent: []string{"ok"}, final: ""},
		{name: "invalid byte is replaced", pieces: []string{"a\xffb"}, sent: []string{"a\uFFFDb"}},
		{name: "stop spanning pieces", pieces: []string{"Hello wo", "rld! more"}, stops: []string{"world"},
			sent: []string{"Hello ", ""}, stop: true},
		{name: "stop prefix that is not a stop", pieces: []string{"Hello wo", "w!"}, stops: []string{"world"},
			sent: []string{"Hello ", "wow!"}},
		{name: "a new stop prefix held", pieces: []string{"Hello wo", "w"}, stops: []string{"world"},
			sent: []string{"Hello ", "wo"}, final: "w"},
		{name: "stop prefix flushed at the end", pieces: []string{"Hello wor"}, stops: []string{"world"},
			sent: []string{"Hello "}, final: "wor"},
		{name: "earliest of two stops", pieces: []string{"abcdef"}, stops: []string{"de", "bc"}, sent: []string{"a"}, stop: true},
		{name: "stop right after a split character", pieces: []string{cjk[:1], cjk[1:] + "##"}, stops: []string{"##"},
			sent: []string{"", cjk}, stop: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := textOut{stops: c.stops}
			stopped := false
			for i, p := range c.pieces {
				s, st := out.add(p)
				if s != c.sent[i] {
					t.Errorf("piece %d %q: sent %q, want %q", i, p, s, c.sent[i])
				}
				if !utf8.ValidString(s) {
					t.Errorf("piece %d: sent invalid UTF-8 %q", i, s)
				}
				if st {
					stopped = true
					break
				}
			}
			if stopped != c.stop {
				t.Fatalf("stopped %v, want %v", stopped, c.stop)
			}
			if !stopped {
				if f := out.flush(); f != c.final {
					t.Errorf("flush %q, want %q", f, c.final)
				}
			}
		})
	}
}

// However a text is cut into pieces, the pieces' text is the text, and
// a stop string is cut at its first occurrence.
func TestTextOutAnyCut(t *testing.T) {
	text := "Bonjour 🌱 le monde 晨花, fin. STOP après"
	b := []byte(text)
	for cut := 1; cut <= 5; cut++ {
		for _, stops := range [][]string{nil, {"STOP"}, {"花,"}, {"🌱 le"}} {
			out := textOut{stops: stops}
			var got strings.Builder
			stopped := false
			for i := 0; i < len(b) && !stopped; i += cut {
				s, st := out.add(string(b[i:min(i+cut, len(b))]))
				got.WriteString(s)
				stopped = st
			}
			if !stopped {
				got.WriteString(out.flush())
			}
			want := text
			if len(stops) > 0 {
				want = text[:strings.Index(text, stops[0])]
			}
			if got.String() != want {
				t.Errorf("pieces of %d bytes, stops %q: %q, want %q", cut, stops, got.String(), want)
			}
		}
	}
}

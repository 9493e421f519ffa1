package api

import (
	"strings"
	"unicode/utf8"
)

// textOut turns a generation's token pieces into the text a client is
// sent. It holds back two kinds of bytes: the tail of a character a later
// token completes (a piece is raw bytes, and an emoji or a CJK character
// often spans tokens), and a tail that may be the start of a stop string.
// What it releases is valid UTF-8, and none of a stop string is ever
// released. Streamed and whole answers go through the same textOut, so
// they are the same text.
type textOut struct {
	stops []string
	// pending are the bytes received and not yet released.
	pending []byte
	stopped bool
}

// add takes the next piece and returns the text that may be sent now;
// stopped reports that a stop string was found (add must not be called
// again; the text before the stop string is in the returned text).
func (t *textOut) add(piece string) (send string, stopped bool) {
	t.pending = append(t.pending, piece...)
	if i := t.firstStop(); i >= 0 {
		t.stopped = true
		send = strings.ToValidUTF8(string(t.pending[:i]), "\uFFFD")
		t.pending = t.pending[:0]
		return send, true
	}
	cut := len(t.pending) - max(incompleteTail(t.pending), t.stopPrefix())
	send = strings.ToValidUTF8(string(t.pending[:cut]), "\uFFFD")
	t.pending = append(t.pending[:0], t.pending[cut:]...)
	return send, false
}

// flush returns what is still held when the generation ends without a
// stop string: a possible stop prefix is text after all; a character the
// generation ended inside of (max_tokens reached mid-character) is left
// out, so the answer stays a prefix of the text a longer one would have.
func (t *textOut) flush() string {
	whole := t.pending[:len(t.pending)-incompleteTail(t.pending)]
	s := strings.ToValidUTF8(string(whole), "\uFFFD")
	t.pending = t.pending[:0]
	return s
}

// firstStop is the index in pending of the earliest stop string, or -1.
func (t *textOut) firstStop() int {
	first := -1
	for _, s := range t.stops {
		if i := strings.Index(string(t.pending), s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	return first
}

// stopPrefix is the length of the longest tail of pending that is a
// proper prefix of a stop string.
func (t *textOut) stopPrefix() int {
	longest := 0
	for _, s := range t.stops {
		for n := min(len(s)-1, len(t.pending)); n > longest; n-- {
			if string(t.pending[len(t.pending)-n:]) == s[:n] {
				longest = n
				break
			}
		}
	}
	return longest
}

// incompleteTail is the length of the tail of b that begins a multi-byte
// UTF-8 character and lacks its last bytes (0 when b ends on a whole
// character, or on bytes no later byte can make valid).
func incompleteTail(b []byte) int {
	for n := 1; n <= min(utf8.UTFMax-1, len(b)); n++ {
		c := b[len(b)-n]
		if c < utf8.RuneSelf {
			return 0 // ASCII: nothing after it is a started character
		}
		if utf8.RuneStart(c) {
			need := 0
			switch {
			case c&0xE0 == 0xC0:
				need = 2
			case c&0xF0 == 0xE0:
				need = 3
			case c&0xF8 == 0xF0:
				need = 4
			}
			if need > n && validPrefix(b[len(b)-n:], need) {
				return n
			}
			return 0
		}
	}
	return 0
}

// validPrefix reports whether b (a lead byte and continuation bytes,
// fewer than the need its lead byte announces) can still become a valid
// character. Every byte after the lead may be 0x80-0xBF except the
// second, whose valid range (narrower after E0, ED, F0 and F4) always
// holds 0x80 or 0xBF: completing b with all of one or all of the other
// decodes when any completion does.
func validPrefix(b []byte, need int) bool {
	for _, pad := range []byte{0x80, 0xBF} {
		full := append([]byte(nil), b...)
		for len(full) < need {
			full = append(full, pad)
		}
		if r, size := utf8.DecodeRune(full); r != utf8.RuneError && size == need {
			return true
		}
	}
	return false
}

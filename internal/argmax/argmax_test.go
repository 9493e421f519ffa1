package argmax

import "testing"

func TestIndex(t *testing.T) {
	for _, c := range []struct {
		v    []float32
		want int32
	}{
		{nil, 0},
		{[]float32{-3}, 0},
		{[]float32{1, 5, 2}, 1},
		{[]float32{7, 2, 7}, 0}, // ties go to the lower index
		{[]float32{-2, -1, -9}, 1},
	} {
		if got := Index(c.v); got != c.want {
			t.Errorf("Index(%v) = %d, want %d", c.v, got, c.want)
		}
	}
}

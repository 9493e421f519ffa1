package gate

import (
	"testing"
	"time"
)

// A pause holds Wait until its time; a shorter later pause does not
// shorten it; an open gate does not wait.
func TestGate(t *testing.T) {
	var g Gate
	t0 := time.Now()
	g.Wait()
	if time.Since(t0) > 10*time.Millisecond {
		t.Fatal("an open gate waited")
	}
	g.Pause(t0.Add(30 * time.Millisecond).UnixNano())
	g.Pause(t0.Add(5 * time.Millisecond).UnixNano())
	g.Wait()
	if d := time.Since(t0); d < 30*time.Millisecond {
		t.Fatalf("waited %v, want at least 30ms", d)
	}
}

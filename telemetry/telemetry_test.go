package telemetry

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
)

// get fetches http://addr+path and returns the status and body.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// The metrics listener serves Go's profiles only when Profiling asks for
// them, and Profiling without a listener is refused rather than ignored.
func TestProfiling(t *testing.T) {
	for _, on := range []bool{false, true} {
		tel, err := Setup(context.Background(), Config{Service: "t", MetricsListen: "127.0.0.1:0", Profiling: on})
		if err != nil {
			t.Fatal(err)
		}
		if code, body := get(t, tel.MetricsAddr, "/metrics"); code != http.StatusOK || !strings.Contains(body, "go_goroutines") {
			t.Fatalf("profiling %v: /metrics %d", on, code)
		}
		code, body := get(t, tel.MetricsAddr, "/debug/pprof/goroutine?debug=1")
		if on && (code != http.StatusOK || !strings.Contains(body, "TestProfiling")) {
			t.Fatalf("profiling on: goroutine profile %d %.200q", code, body)
		}
		if !on && code != http.StatusNotFound {
			t.Fatalf("profiling off: goroutine profile answered %d", code)
		}
		if on {
			if code, _ := get(t, tel.MetricsAddr, "/debug/pprof/profile?seconds=1"); code != http.StatusOK {
				t.Fatalf("CPU profile: %d", code)
			}
		}
		tel.Shutdown(context.Background())
	}
	if _, err := Setup(context.Background(), Config{Service: "t", Profiling: true}); err == nil {
		t.Fatal("profiling without a metrics listener was accepted")
	}
}

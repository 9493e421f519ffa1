package telemetry

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Scrape takes a name's unlabelled sample over a labelled one, the first
// labelled one when that is all there is, ignores comments and other
// names, and fails on a name the page lacks.
func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP a_total x\n# TYPE a_total counter\na_total{otel_scope_name=\"s\"} 3\na_total 7\n"+
			"b{x=\"1\"} 2.5\nb{x=\"2\"} 9\nab 11\n")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	m, err := Scrape(addr, "a_total", "b")
	if err != nil || m["a_total"] != 7 || m["b"] != 2.5 || len(m) != 2 {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := Scrape(addr, "a_total", "c"); err == nil || !strings.Contains(err.Error(), "lack c") {
		t.Fatalf("a missing name: %v", err)
	}
}

package engine

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRulesTable: every test, scenario and serve flag the rules table in
// doc.go names exists, so the table cannot drift from the code.
func TestRulesTable(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	var tests strings.Builder
	files, _ := filepath.Glob("*_test.go")
	more, _ := filepath.Glob(filepath.Join("sched", "*_test.go"))
	files = append(files, more...)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tests.Write(b)
	}
	serve, err := os.ReadFile(filepath.Join("..", "cmd", "shardd", "serve.go"))
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`\bTest\w+`).FindAllString(string(doc), -1)
	scenarios := regexp.MustCompile(`\bsched/testdata/\w+`).FindAllString(string(doc), -1)
	for _, f := range scenarios {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("doc.go names %s, which is not a scenario: %v", f, err)
		}
	}
	flags := regexp.MustCompile(`--[a-z-]+`).FindAllString(string(doc), -1)
	if len(names)+len(scenarios) < 20 || len(flags) < 10 {
		t.Fatalf("the table names %d tests, %d scenarios and %d flags", len(names), len(scenarios), len(flags))
	}
	for _, n := range names {
		if !strings.Contains(tests.String(), "func "+n+"(") {
			t.Errorf("doc.go names %s, which is not a test of engine or engine/sched", n)
		}
	}
	for _, f := range flags {
		if !strings.Contains(string(serve), `"`+strings.TrimPrefix(f, "--")+`"`) {
			t.Errorf("doc.go names %s, which is not a serve flag", f)
		}
	}
}

// Package funclen holds one test: the size rule for functions in the
// command layer and the engine (README, "Layout").
package funclen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// limits: the most lines a function (declaration to closing brace) may
// have in the non-test files of each folder, relative to the module root.
var limits = map[string]int{
	"cmd/shardd": 80,
	"engine":     100,
}

// TestFunctionLength fails for every function over its folder's limit.
func TestFunctionLength(t *testing.T) {
	for dir, limit := range limits {
		for _, f := range longFuncs(t, filepath.Join("..", "..", dir), limit) {
			t.Errorf("%s/%s: %d lines (limit %d)", dir, f.name, f.lines, limit)
		}
	}
}

type long struct {
	name  string
	lines int
}

func longFuncs(t *testing.T, dir string, limit int) []long {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no Go files (%v)", dir, err)
	}
	fset := token.NewFileSet()
	var out []long
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n > limit {
				out = append(out, long{filepath.Base(path) + ":" + fn.Name.Name, n})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].lines > out[j].lines })
	return out
}

// Package funclen holds the size rules, as tests: functions in every
// package of the module (README, "Layout") at most 100 lines, 80 in the
// command layer (generated code, gen/, is not ours to size); README and
// PERF.md at most 400 and 700 lines (doclen_test.go).
package funclen

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// limit is the most lines a function (declaration to closing brace) may
// have in the non-test files of a folder, relative to the module root.
func limit(dir string) int {
	if dir == "cmd" || strings.HasPrefix(dir, "cmd/") {
		return 80
	}
	return 100
}

// TestFunctionLength fails for every function over its folder's limit.
func TestFunctionLength(t *testing.T) {
	dirs := goDirs(t)
	if len(dirs) < 10 {
		t.Fatalf("found only %d package folders: %v", len(dirs), dirs)
	}
	for _, dir := range dirs {
		for _, f := range longFuncs(t, filepath.Join("..", "..", dir), limit(dir)) {
			t.Errorf("%s/%s: %d lines (limit %d)", dir, f.name, f.lines, limit(dir))
		}
	}
}

// goDirs lists the module's folders with Go files, relative to its root,
// less generated code, build outputs and hidden folders.
func goDirs(t *testing.T) []string {
	t.Helper()
	root := filepath.Join("..", "..")
	seen := map[string]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			switch {
			case rel == ".":
			case strings.HasPrefix(d.Name(), "."), rel == "gen", rel == "out", d.Name() == "testdata":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			seen[filepath.Dir(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var dirs []string
	for d := range seen {
		dirs = append(dirs, filepath.ToSlash(d))
	}
	sort.Strings(dirs)
	return dirs
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

package gguf

import (
	"fmt"
	"os"
	"path/filepath"
)

// CachedPreset returns the path of a generated preset model in dir, writing
// it first when it is absent. Generation is deterministic, so a file made by
// an earlier run is the same model.
func CachedPreset(dir, preset string) (string, error) {
	s, ok := Presets[preset]
	if !ok {
		return "", fmt.Errorf("gguf: unknown preset %q", preset)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s-seed%d.gguf", preset, s.Seed))
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp := path + ".tmp"
	if err := Generate(tmp, s); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// CachedSplit returns the shards of model split n ways in dir, splitting
// first when they are absent.
func CachedSplit(model string, n int, dir string) ([]string, error) {
	meta, err := Read(model)
	if err != nil {
		return nil, err
	}
	ranges := EvenRanges(meta.BlockCount, n)
	var paths []string
	for _, r := range ranges {
		p := ShardPath(model, dir, r)
		if _, err := os.Stat(p); err != nil {
			return Split(model, ranges, dir, nil)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

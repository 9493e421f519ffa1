package gguf

import (
	"crypto/sha256"
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
	return CachedSpec(dir, preset, s)
}

// CachedSpec returns the model s generates, cached in dir under name and a
// digest of the whole spec, generating it first when absent. A changed spec
// is never answered with a file generated from an older one.
func CachedSpec(dir, name string, s Spec) (string, error) {
	sum := sha256.Sum256([]byte(fmt.Sprintf("%+v", s)))
	path := filepath.Join(dir, fmt.Sprintf("%s-%s-%x.gguf", name, s.Weights, sum[:4]))
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
	ranges, err := meta.EvenRanges(n)
	if err != nil {
		return nil, err
	}
	return CachedRanges(model, ranges, dir)
}

// CachedRanges returns the shards of model cut at ranges in dir, splitting
// first when any is absent.
func CachedRanges(model string, ranges []Range, dir string) ([]string, error) {
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

// Package recipe reads the runtime recipe as a worker's capability report
// carries it: its key=value lines, Sep apart, in the report's backend field
// (engine.Recipe.Lines), so a person or a head can say why two recipe
// digests differ.
package recipe

import "strings"

// Sep joins a recipe's lines in the capability report's backend field.
const Sep = "; "

// Diff lists the lines of two recipes (as GetCapability's backend
// fields carry them, Sep apart) that differ, "key: a | b".
func Diff(a, b string) []string {
	split := func(s string) (map[string]string, []string) {
		m, keys := map[string]string{}, []string(nil)
		for _, l := range strings.Split(s, Sep) {
			k, v, _ := strings.Cut(l, "=")
			if _, dup := m[k]; !dup {
				keys = append(keys, k)
			}
			m[k] = v
		}
		return m, keys
	}
	ma, ka := split(a)
	mb, kb := split(b)
	var out []string
	for _, k := range append(ka, kb...) {
		if va, vb := ma[k], mb[k]; va != vb {
			out = append(out, k+": "+va+" | "+vb)
			ma[k], mb[k] = va, va // once
		}
	}
	return out
}

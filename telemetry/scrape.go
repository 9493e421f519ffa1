package telemetry

import (
	"bufio"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Scrape reads the named samples from the Prometheus page a worker serves
// at http://addr/metrics (--metrics-listen): for each name, its unlabelled
// sample or else its first labelled one. A name the page lacks is an
// error, so a renamed metric is not read as zero.
func Scrape(addr string, names ...string) (map[string]float64, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := make(map[string]float64, len(names))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		name, _, labelled := strings.Cut(f[0], "{")
		if _, seen := out[name]; (seen && labelled) || !slices.Contains(names, name) {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[name] = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("metrics at %s lack %s", addr, n)
		}
	}
	return out, nil
}

package load

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// hist is a latency histogram in microseconds (1 µs to 1 h, three
// significant digits). Not safe for concurrent use: the recorder's mutex
// guards it.
type hist struct{ h *hdrhistogram.Histogram }

const histMaxMicros = int64(time.Hour / time.Microsecond)

func newHist() hist { return hist{hdrhistogram.New(1, histMaxMicros, 3)} }

func (h hist) record(d time.Duration) {
	h.h.RecordValue(min(max(d.Microseconds(), 1), histMaxMicros))
}

// Dist summarises a histogram. Times are in milliseconds.
type Dist struct {
	Count int64   `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
	// CDF is [value_ms, quantile] points, quantile rising from 0 to 1,
	// for plots; present on the request-level distributions.
	CDF [][2]float64 `json:"cdf,omitempty"`
}

func ms(us int64) float64 { return float64(us) / 1e3 }

// dist summarises h; withCDF adds the points of its CDF.
func (h hist) dist(withCDF bool) Dist {
	if h.h.TotalCount() == 0 {
		return Dist{}
	}
	d := Dist{Count: h.h.TotalCount(), Mean: h.h.Mean() / 1e3,
		P50: ms(h.h.ValueAtQuantile(50)), P90: ms(h.h.ValueAtQuantile(90)),
		P99: ms(h.h.ValueAtQuantile(99)), Max: ms(h.h.Max())}
	if withCDF {
		for _, q := range cdfQuantiles {
			d.CDF = append(d.CDF, [2]float64{ms(h.h.ValueAtQuantile(q * 100)), q})
		}
	}
	return d
}

// cdfQuantiles are the points a plotted CDF has: dense in the tail.
var cdfQuantiles = func() []float64 {
	var qs []float64
	for q := 0.0; q < 0.9; q += 0.02 {
		qs = append(qs, q)
	}
	for q := 0.9; q < 0.99; q += 0.005 {
		qs = append(qs, q)
	}
	return append(qs, 0.99, 0.995, 0.999, 1)
}()

// Stat returns the named field of d ("p50", "p90", "p99", "max", "mean")
// in milliseconds.
func (d Dist) Stat(name string) (float64, bool) {
	switch name {
	case "p50":
		return d.P50, true
	case "p90":
		return d.P90, true
	case "p99":
		return d.P99, true
	case "max":
		return d.Max, true
	case "mean":
		return d.Mean, true
	}
	return 0, false
}

// series keeps at most cap points of a time series, as a deterministic
// reservoir sample once it is full.
type series struct {
	pts  [][2]float64
	seen int
	cap  int
	rng  uint64
}

func (s *series) add(p [2]float64) {
	s.seen++
	if len(s.pts) < s.cap {
		s.pts = append(s.pts, p)
		return
	}
	s.rng = s.rng*6364136223846793005 + 1442695040888963407
	if j := int((s.rng >> 33) % uint64(s.seen)); j < s.cap {
		s.pts[j] = p
	}
}

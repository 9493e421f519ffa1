package sched

import (
	"math"
	"time"
)

// costModel predicts a forward's time from the rows in its batch,
// t = base + perRow x rows, fitted online by least squares over recent
// forwards (each older sample weighs 2% less per new one). The scheduler
// feeds it the forwards of up to costMaxRows rows (a CPU forward is far
// cheaper per row in large batches, so large prefill-only forwards would
// bend the line away from the small batches it decides about) and asks it
// how many prefill tokens fit beside an iteration's decode rows within the
// decode budget.
type costModel struct {
	sw, sx, sy, sxx, sxy float64 // weighted sums of 1, rows, seconds, rows², rows x seconds
	n                    int
}

const (
	costForget  = 0.98
	costMinRuns = 8  // forwards before the model is trusted
	costMaxRows = 64 // larger forwards are not fed to the model
)

func (m *costModel) add(rows int, d time.Duration) {
	x, y := float64(rows), d.Seconds()
	m.sw = m.sw*costForget + 1
	m.sx = m.sx*costForget + x
	m.sy = m.sy*costForget + y
	m.sxx = m.sxx*costForget + x*x
	m.sxy = m.sxy*costForget + x*y
	m.n++
}

// coef returns the fitted base and per-row cost in seconds. With too little
// spread in the batch sizes seen so far it attributes all time per row.
func (m *costModel) coef() (base, perRow float64, ok bool) {
	if m.n < costMinRuns || m.sx == 0 {
		return 0, 0, false
	}
	det := m.sw*m.sxx - m.sx*m.sx
	if det > 1e-9*m.sw*m.sxx {
		perRow = (m.sw*m.sxy - m.sx*m.sy) / det
		base = (m.sy - perRow*m.sx) / m.sw
	}
	if perRow <= 0 || base < 0 {
		// Not enough spread (or noise): the mean time per row.
		base, perRow = 0, m.sy/m.sx
	}
	return base, perRow, true
}

// predict is the expected time of a forward of rows rows.
func (m *costModel) predict(rows int) (time.Duration, bool) {
	base, perRow, ok := m.coef()
	if !ok {
		return 0, false
	}
	return time.Duration((base + perRow*float64(rows)) * float64(time.Second)), true
}

// fit returns how many rows can be added to a forward of rows rows without
// its predicted time passing budget (0 when none or the model is not ready).
func (m *costModel) fit(rows int, budget time.Duration) int {
	t, ok := m.predict(rows)
	if !ok {
		return 0
	}
	return m.fitAfter(t, budget)
}

// fitAfter returns how many rows can be added, at the model's cost per
// row, to a forward expected to take t without passing budget (0 when none
// or the model is not ready). It prices only the added rows: a caller that
// measured t need not trust the line's intercept, which on a CPU sits well
// above what small batches take (the line is fitted over batches of up to
// costMaxRows rows, and a forward's cost per row falls as its batch
// grows).
func (m *costModel) fitAfter(t, budget time.Duration) int {
	return m.fitAfterAtLeast(t, budget, 0)
}

// fitAfterAtLeast is fitAfter with each added row priced at no less than
// floor: a cost per row measured where the rows go, when the line's
// slope is lower.
func (m *costModel) fitAfterAtLeast(t, budget, floor time.Duration) int {
	_, perRow, ok := m.coef()
	if !ok {
		return 0
	}
	perRow = max(perRow, floor.Seconds())
	if perRow <= 0 {
		return 0
	}
	extra := (budget - t).Seconds() / perRow
	if extra < 1 || math.IsNaN(extra) {
		return 0
	}
	return int(min(extra, 1<<20))
}

// ewma is an exponentially weighted moving average of durations (a new
// sample weighs 1/8).
type ewma struct {
	v  time.Duration
	ok bool
}

func (a *ewma) add(d time.Duration) {
	if !a.ok {
		a.v, a.ok = d, true
		return
	}
	a.v += (d - a.v) / 8
}

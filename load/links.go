package load

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Link is the network condition of one hop's connection (head <-> worker;
// in shardd the head carries every activation, so each hop is one link).
// It is made by a toxiproxy proxy on loopback in the harness's process.
type Link struct {
	// Latency is added in each direction (one way), with Jitter: a step's
	// round trip gains about 2 x Latency. Toxiproxy counts whole
	// milliseconds.
	Latency, Jitter time.Duration
	// BandwidthKBps caps each direction (kilobytes per second; 0: none).
	BandwidthKBps int64
	// Every ResetEvery, every connection through the link is closed
	// mid-stream once (the proxy stops and listens again).
	ResetEvery time.Duration
	// Every StallEvery, data entering the link in the next StallFor is
	// held StallFor before it goes on.
	StallEvery, StallFor time.Duration
}

// ParseLinks reads --link values: "HOP=COND,COND..." where HOP is a hop
// index from 0 or "all", and COND is latency:DUR, jitter:DUR,
// bandwidth:RATE (e.g. 1gbit, 100mbit, 500kbit, 10mbyte), reset:EVERY or
// stall:FOR/EVERY.
func ParseLinks(items []string, hops int) (map[int]Link, error) {
	out := map[int]Link{}
	for _, item := range items {
		hopS, conds, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%w: --link %q: want HOP=COND,...", ErrInput, item)
		}
		var l Link
		for _, c := range strings.Split(conds, ",") {
			k, v, _ := strings.Cut(strings.TrimSpace(c), ":")
			var err error
			switch k {
			case "latency":
				l.Latency, err = linkDuration(v)
			case "jitter":
				l.Jitter, err = linkDuration(v)
			case "bandwidth":
				l.BandwidthKBps, err = parseRate(v)
			case "reset":
				l.ResetEvery, err = linkDuration(v)
			case "stall":
				d, e, ok2 := strings.Cut(v, "/")
				if l.StallFor, err = linkDuration(d); err == nil && ok2 {
					l.StallEvery, err = linkDuration(e)
				} else if err == nil {
					err = fmt.Errorf("want FOR/EVERY")
				}
			default:
				err = fmt.Errorf("unknown condition (latency, jitter, bandwidth, reset, stall)")
			}
			if err != nil {
				return nil, fmt.Errorf("%w: --link %q: %s: %v", ErrInput, item, k, err)
			}
		}
		if hopS == "all" {
			for h := range hops {
				out[h] = l
			}
			continue
		}
		h, err := strconv.Atoi(hopS)
		if err != nil || h < 0 || h >= hops {
			return nil, fmt.Errorf("%w: --link %q: hop must be 0..%d or all", ErrInput, item, hops-1)
		}
		out[h] = l
	}
	return out, nil
}

func linkDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err == nil && d <= 0 {
		err = fmt.Errorf("must be positive")
	}
	return d, err
}

// parseRate reads a bandwidth as kilobytes per second.
func parseRate(v string) (int64, error) {
	units := []struct {
		suffix string
		bytes  float64 // per second, per unit
	}{{"gbit", 1e9 / 8}, {"mbit", 1e6 / 8}, {"kbit", 1e3 / 8}, {"gbyte", 1e9}, {"mbyte", 1e6}, {"kbyte", 1e3}}
	for _, u := range units {
		if n, ok := strings.CutSuffix(strings.ToLower(v), u.suffix); ok {
			f, err := strconv.ParseFloat(n, 64)
			if err != nil || f <= 0 {
				return 0, fmt.Errorf("bad rate %q", v)
			}
			return max(1, int64(f*u.bytes/1e3)), nil
		}
	}
	return 0, fmt.Errorf("rate %q needs a unit: gbit, mbit, kbit, gbyte, mbyte or kbyte", v)
}

// Proxies are running links, one per conditioned hop.
type Proxies struct {
	proxies []*toxiproxy.Proxy
	stop    chan struct{}
	wg      sync.WaitGroup
}

// StartLinks puts a proxy with each link's conditions in front of the hop
// it names and returns the addresses the head should dial, in hop order
// (the worker's own address where a hop has no link).
func StartLinks(workers []string, links map[int]Link) ([]string, *Proxies, error) {
	px := &Proxies{stop: make(chan struct{})}
	addrs := append([]string(nil), workers...)
	if len(links) == 0 {
		return addrs, px, nil
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.New(io.Discard))
	for hop := range workers {
		l, ok := links[hop]
		if !ok {
			continue
		}
		p := toxiproxy.NewProxy(srv, fmt.Sprintf("hop%d", hop), "127.0.0.1:0", workers[hop])
		if err := p.Start(); err != nil {
			px.Close()
			return nil, nil, fmt.Errorf("load: link for hop %d: %w", hop, err)
		}
		px.proxies = append(px.proxies, p)
		addrs[hop] = p.Listen
		for _, dir := range []string{"upstream", "downstream"} {
			if l.Latency > 0 || l.Jitter > 0 {
				if err := addToxic(p, "latency_"+dir, "latency", dir, fmt.Sprintf(`{"latency":%d,"jitter":%d}`,
					l.Latency.Milliseconds(), l.Jitter.Milliseconds())); err != nil {
					px.Close()
					return nil, nil, err
				}
			}
			if l.BandwidthKBps > 0 {
				if err := addToxic(p, "bandwidth_"+dir, "bandwidth", dir, fmt.Sprintf(`{"rate":%d}`, l.BandwidthKBps)); err != nil {
					px.Close()
					return nil, nil, err
				}
			}
		}
		if l.ResetEvery > 0 {
			px.resets(l.ResetEvery, p)
		}
		if l.StallEvery > 0 {
			px.every(l.StallEvery, l.StallFor, p, "stall", "latency", fmt.Sprintf(`{"latency":%d}`, l.StallFor.Milliseconds()))
		}
	}
	return addrs, px, nil
}

func addToxic(p *toxiproxy.Proxy, name, typ, stream, attrs string) error {
	_, err := p.Toxics.AddToxicJson(strings.NewReader(fmt.Sprintf(
		`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, stream, attrs)))
	if err != nil {
		return fmt.Errorf("load: toxic %s: %w", name, err)
	}
	return nil
}

// every adds a downstream toxic for window, once per period, until Close.
func (px *Proxies) every(period, window time.Duration, p *toxiproxy.Proxy, name, typ, attrs string) {
	px.wg.Go(func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-px.stop:
				return
			case <-tk.C:
			}
			if addToxic(p, name, typ, "downstream", attrs) != nil {
				continue
			}
			select {
			case <-px.stop:
			case <-time.After(window):
			}
			p.Toxics.RemoveToxic(context.Background(), name)
		}
	})
}

// resets drops every connection through p once per period: the proxy
// stops (closing its connections mid-stream) and listens again on the
// same address. (Toxiproxy's reset_peer toxic, added and removed while
// links are live, can wedge a link for good, so it is not used.)
func (px *Proxies) resets(period time.Duration, p *toxiproxy.Proxy) {
	px.wg.Go(func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-px.stop:
				return
			case <-tk.C:
			}
			p.Stop()
			if err := p.Start(); err != nil {
				return
			}
		}
	})
}

// Close stops the proxies and their timers.
func (px *Proxies) Close() {
	if px == nil {
		return
	}
	select {
	case <-px.stop:
	default:
		close(px.stop)
	}
	px.wg.Wait()
	for _, p := range px.proxies {
		p.Stop()
	}
}

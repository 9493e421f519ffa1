package load

import (
	"fmt"
	"io"
	"strconv"
	"strings"
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
}

// Periodic resets and stalls are not offered: toxiproxy 2.5.0 wedges a
// link for good when a toxic is added or removed while connections are
// live, and stopping and restarting the proxy to drop its connections left
// a generation stuck on the other, direct hop (issue 17's head that waits
// forever). Both were tried; runs hung.
var errDynamic = fmt.Errorf("%w: periodic resets and stalls are not supported (see load/links.go)", ErrInput)

// ParseLinks reads --link values: "HOP=COND,COND..." where HOP is a hop
// index from 0 or "all", and COND is latency:DUR, jitter:DUR or
// bandwidth:RATE (e.g. 1gbit, 100mbit, 500kbit, 10mbyte).
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
				l.Latency, err = wholeMillis(v)
			case "jitter":
				l.Jitter, err = wholeMillis(v)
			case "bandwidth":
				l.BandwidthKBps, err = parseRate(v)
			case "reset", "stall":
				return nil, errDynamic
			default:
				err = fmt.Errorf("unknown condition (latency, jitter, bandwidth)")
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

// wholeMillis reads a positive duration of whole milliseconds, the unit
// toxiproxy's latency toxic counts in.
func wholeMillis(v string) (time.Duration, error) {
	d, err := linkDuration(v)
	if err == nil && d%time.Millisecond != 0 {
		err = fmt.Errorf("whole milliseconds only (the proxy counts in ms)")
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
}

// StartLinks puts a proxy with each link's conditions in front of the hop
// it names and returns the addresses the head should dial, in hop order
// (the worker's own address where a hop has no link).
func StartLinks(workers []string, links map[int]Link) ([]string, *Proxies, error) {
	px := &Proxies{}
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

// Close stops the proxies.
func (px *Proxies) Close() {
	if px == nil {
		return
	}
	for _, p := range px.proxies {
		p.Stop()
	}
	px.proxies = nil
}

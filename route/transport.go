package route

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strings"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/frames"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/relay"
	"github.com/meshnet/shardd/stages/decode"
)

// A hop's address says how the head reaches it:
//
//	HOST:PORT                   gRPC, direct
//	relay://HOST:PORT/NAME      frames through the relay at HOST:PORT, to
//	                            the worker registered there as NAME
//	frames://HOST:PORT          frames over a direct TCP connection (a
//	                            worker's --frames-listen)
//
// One route may mix them. With Options.TLS a frame hop runs TLS end to end
// over the byte stream, through the relay: the worker's certificate must
// name NAME (relay) or HOST (frames) unless Options.TLS.ServerName is set.
const (
	schemeRelay  = "relay://"
	schemeFrames = "frames://"
)

// NetAddr is the TCP address a hop's connections go to: the relay's for a
// relayed hop.
func NetAddr(hop string) string {
	switch {
	case strings.HasPrefix(hop, schemeRelay):
		if addr, _, err := relay.ParseURL(hop); err == nil {
			return addr
		}
	case strings.HasPrefix(hop, schemeFrames):
		return strings.TrimPrefix(hop, schemeFrames)
	}
	return hop
}

// frameClient returns the client of a frame hop, or nil for a gRPC one.
func frameClient(hop string, tlsCfg *tls.Config) (shardv1.ShardRuntimeClient, error) {
	var dial frames.Dialer
	var serverName string
	switch {
	case strings.HasPrefix(hop, schemeRelay):
		addr, name, err := relay.ParseURL(hop)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRoute, err)
		}
		dial = func(ctx context.Context) (net.Conn, error) { return relay.Dial(ctx, addr, name) }
		serverName = name
	case strings.HasPrefix(hop, schemeFrames):
		addr := strings.TrimPrefix(hop, schemeFrames)
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrRoute, hop, err)
		}
		dial = func(ctx context.Context) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}
		serverName = host
	case strings.Contains(hop, "://"):
		return nil, fmt.Errorf("%w: %q: a hop is HOST:PORT, relay://HOST:PORT/NAME or frames://HOST:PORT", ErrRoute, hop)
	default:
		return nil, nil
	}
	if tlsCfg != nil {
		cfg := tlsCfg.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = serverName
		}
		plain := dial
		dial = func(ctx context.Context) (net.Conn, error) {
			c, err := plain(ctx)
			if err != nil {
				return nil, err
			}
			tc := tls.Client(c, cfg)
			if err := tc.HandshakeContext(ctx); err != nil {
				c.Close()
				return nil, err
			}
			return tc, nil
		}
	}
	return frames.NewClient(dial, frames.Config{Codec: decode.Codec{Pool: bufpool.Default}, Pool: bufpool.Default, MaxRecv: maxResponseBytes}), nil
}

package main

import (
	"crypto/x509"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/meshnet/shardd/internal/tlsconf/tlstest"
)

// Plaintext is allowed on loopback only, unless asked for; TLS flags give
// a configuration; a server's client CA needs its certificate.
func TestTLSFlags(t *testing.T) {
	p := tlstest.NewPKI(t, "ca")
	cert, key := p.Leaf("w", time.Now().Add(time.Hour), x509.ExtKeyUsageServerAuth)
	for _, c := range []struct {
		name   string
		server bool
		args   []string
		addrs  []string
		tls    bool
		err    bool
	}{
		{"loopback plaintext", true, nil, []string{"127.0.0.1:7070"}, false, false},
		{"localhost plaintext", false, nil, []string{"localhost:1", "[::1]:2"}, false, false},
		{"every interface, plaintext", true, nil, []string{":7070"}, false, true},
		{"remote head, plaintext", false, nil, []string{"127.0.0.1:1", "10.0.0.2:7070"}, false, true},
		{"asked for plaintext", true, []string{"--plaintext"}, []string{"0.0.0.0:7070"}, false, false},
		{"server TLS", true, []string{"--tls-cert", cert, "--tls-key", key}, []string{"0.0.0.0:7070"}, true, false},
		{"server mutual TLS", true, []string{"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", p.CAFile()}, []string{":1"}, true, false},
		{"client CA without a certificate", true, []string{"--tls-client-ca", p.CAFile()}, []string{":1"}, false, true},
		{"certificate without its key", true, []string{"--tls-cert", cert}, []string{":1"}, false, true},
		{"client TLS", false, []string{"--tls-ca", p.CAFile()}, []string{"10.0.0.2:7070"}, true, false},
	} {
		fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f *tlsFlags
		if c.server {
			f = addServerTLS(fs)
		} else {
			f = addClientTLS(fs)
		}
		if err := fs.Parse(c.args); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		cfg, err := f.config(c.addrs, nil)
		if (err != nil) != c.err || (cfg != nil) != c.tls {
			t.Errorf("%s: config %v, error %v", c.name, cfg != nil, err)
		}
	}
}

package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/meshnet/shardd/internal/tlsconf"
)

// tlsFlags are a command's transport security flags. Without a certificate
// or CA, traffic is plaintext, which is allowed only to and on loopback
// addresses unless --plaintext asks for it.
type tlsFlags struct {
	server        bool
	cert, key, ca *string
	plaintext     *bool
	reloader      *tlsconf.Reloader
}

func addServerTLS(fs *flag.FlagSet) *tlsFlags {
	return &tlsFlags{server: true,
		cert:      fs.String("tls-cert", "", "PEM certificate chain: serve TLS 1.3 (reloaded on SIGHUP or when the file changes)"),
		key:       fs.String("tls-key", "", "PEM private key of --tls-cert"),
		ca:        fs.String("tls-client-ca", "", "PEM CA bundle: require client certificates that chain to it (mutual TLS)"),
		plaintext: fs.Bool("plaintext", false, "serve without TLS on a non-loopback address (without it, plaintext is served on loopback only)"),
	}
}

func addClientTLS(fs *flag.FlagSet) *tlsFlags { return addClientTLSNamed(fs, "") }

// addClientTLSNamed adds the client TLS flags with a prefix on their
// names ("worker-" for a command that also serves TLS itself).
func addClientTLSNamed(fs *flag.FlagSet, prefix string) *tlsFlags {
	return &tlsFlags{
		ca:        fs.String(prefix+"tls-ca", "", "PEM CA bundle the workers' certificates must chain to: connect with TLS 1.3"),
		cert:      fs.String(prefix+"tls-cert", "", "PEM client certificate chain, for workers that require one (mutual TLS)"),
		key:       fs.String(prefix+"tls-key", "", "PEM private key of --"+prefix+"tls-cert"),
		plaintext: fs.Bool(prefix+"plaintext", false, "connect without TLS to non-loopback workers (without it, plaintext goes to loopback only)"),
	}
}

// isLoopback reports whether a host:port names a loopback address
// ("localhost" included; an empty host is every interface).
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// config returns the TLS configuration (nil: plaintext) for a server
// listening on addrs[0] or a client dialling addrs.
func (f *tlsFlags) config(addrs []string, log *slog.Logger) (*tls.Config, error) {
	if *f.cert == "" && *f.key == "" && *f.ca == "" {
		if !*f.plaintext {
			for _, a := range addrs {
				if !isLoopback(a) {
					return nil, fmt.Errorf("%s is not a loopback address: give TLS flags (--tls-cert/--tls-key, --tls-ca), or --plaintext to send in the clear", a)
				}
			}
		}
		return nil, nil
	}
	if f.server && *f.cert == "" {
		return nil, fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
	}
	r, err := tlsconf.New(tlsconf.Files{Cert: *f.cert, Key: *f.key, CA: *f.ca})
	if err != nil {
		return nil, err
	}
	if log != nil {
		r.OnError = func(err error) { log.Error("TLS reload failed; the previous certificate stays", "err", err) }
	}
	f.reloader = r
	if f.server {
		return r.ServerConfig(), nil
	}
	return r.ClientConfig(), nil
}

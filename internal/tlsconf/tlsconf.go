// Package tlsconf builds the TLS configurations of shardd's gRPC server and
// clients from PEM files, and reloads them without a restart.
//
// A server's certificate and key, and the CA bundle it verifies clients
// against (mutual TLS), are read again when any of their files changes
// (checked at most once a second, at a handshake) or when Reload is
// called (serve calls it on SIGHUP). A reload that fails keeps the
// previous configuration and reports the error: a half-written file never
// takes a worker off the air. Connections already established keep the
// certificate they were made with.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ErrNoCerts: a CA file held no certificate.
var ErrNoCerts = errors.New("tlsconf: no PEM certificate in the CA file")

// Files names the PEM files of one side.
type Files struct {
	Cert, Key string // this side's certificate chain and private key
	// CA: for a server, the clients' CA bundle (set: mutual TLS, a client
	// without a certificate that chains to it is refused); for a client,
	// the CA bundle that the server's certificate must chain to.
	CA string
}

// state is one loaded configuration.
type state struct {
	cert *tls.Certificate
	pool *x509.CertPool
	mod  []time.Time // modification times of the files, in Files order
}

// Reloader holds a side's current certificate and CA pool.
type Reloader struct {
	files Files
	mu    sync.Mutex
	cur   state     // guarded by mu
	check time.Time // guarded by mu: when the files were last looked at
	// OnError, when set, is told of a reload that failed (the previous
	// configuration stays).
	OnError func(error)
}

// New loads files. Cert and Key are both set or both empty.
func New(files Files) (*Reloader, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, errors.New("tlsconf: a certificate needs its key, and a key its certificate")
	}
	r := &Reloader{files: files}
	st, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur, r.check = st, time.Now()
	return r, nil
}

func (r *Reloader) paths() []string {
	var p []string
	for _, f := range []string{r.files.Cert, r.files.Key, r.files.CA} {
		if f != "" {
			p = append(p, f)
		}
	}
	return p
}

func (r *Reloader) load() (state, error) {
	var st state
	for _, p := range r.paths() {
		fi, err := os.Stat(p)
		if err != nil {
			return st, fmt.Errorf("tlsconf: %w", err)
		}
		st.mod = append(st.mod, fi.ModTime())
	}
	if r.files.Cert != "" {
		c, err := tls.LoadX509KeyPair(r.files.Cert, r.files.Key)
		if err != nil {
			return st, fmt.Errorf("tlsconf: %s: %w", r.files.Cert, err)
		}
		st.cert = &c
	}
	if r.files.CA != "" {
		pem, err := os.ReadFile(r.files.CA)
		if err != nil {
			return st, fmt.Errorf("tlsconf: %w", err)
		}
		st.pool = x509.NewCertPool()
		if !st.pool.AppendCertsFromPEM(pem) {
			return st, fmt.Errorf("%w: %s", ErrNoCerts, r.files.CA)
		}
	}
	return st, nil
}

// Reload reads the files again; on error the previous configuration stays.
func (r *Reloader) Reload() error {
	st, err := r.load()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.check = time.Now()
	if err != nil {
		return err
	}
	r.cur = st
	return nil
}

// current returns the configuration, reloading first when a file changed
// (looked at most once a second).
func (r *Reloader) current() state {
	r.mu.Lock()
	if time.Since(r.check) < time.Second {
		defer r.mu.Unlock()
		return r.cur
	}
	r.check = time.Now()
	changed := false
	for i, p := range r.paths() {
		if fi, err := os.Stat(p); err == nil && i < len(r.cur.mod) && !fi.ModTime().Equal(r.cur.mod[i]) {
			changed = true
		}
	}
	r.mu.Unlock()
	if changed {
		if err := r.Reload(); err != nil && r.OnError != nil {
			r.OnError(err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// ServerConfig is a server's TLS configuration (TLS 1.3 only): the current
// certificate at every handshake, and with a CA, client certificates
// required and verified against the current CA pool.
func (r *Reloader) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			st := r.current()
			c := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*st.cert}, NextProtos: []string{"h2"}}
			if st.pool != nil {
				c.ClientCAs, c.ClientAuth = st.pool, tls.RequireAndVerifyClientCert
			}
			return c, nil
		},
	}
}

// ClientConfig is a client's TLS configuration: the server must chain to
// the CA bundle (the system roots when there is none), and with a
// certificate, it is presented (reloaded like a server's).
func (r *Reloader) ClientConfig() *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: r.cur.pool}
	if r.files.Cert != "" {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.current().cert, nil
		}
	}
	return c
}

package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
	"time"

	"github.com/meshnet/shardd/internal/tlsconf/tlstest"
)

// serve accepts TLS connections with cfg and completes each handshake,
// reporting the peer's subject (or the handshake error) on the channel.
func serve(t *testing.T, cfg *tls.Config) (string, chan error) {
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	errs := make(chan error, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			errs <- c.(*tls.Conn).Handshake()
			c.Close()
		}
	}()
	return lis.Addr().String(), errs
}

// dial completes a client handshake and returns the server's leaf subject.
func dial(addr string, cfg *tls.Config) (string, error) {
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestMutualTLS(t *testing.T) {
	servers, clients := tlstest.NewPKI(t, "servers"), tlstest.NewPKI(t, "clients")
	sc, sk := servers.Leaf("worker", time.Now().Add(time.Hour), x509.ExtKeyUsageServerAuth)
	srv, err := New(Files{Cert: sc, Key: sk, CA: clients.CAFile()})
	if err != nil {
		t.Fatal(err)
	}
	addr, handshakes := serve(t, srv.ServerConfig())

	client := func(cert, key string) *tls.Config {
		r, err := New(Files{Cert: cert, Key: key, CA: servers.CAFile()})
		if err != nil {
			t.Fatal(err)
		}
		return r.ClientConfig()
	}
	good, goodKey := clients.Leaf("head", time.Now().Add(time.Hour), x509.ExtKeyUsageClientAuth)
	expired, expiredKey := clients.Leaf("old-head", time.Now().Add(-time.Hour), x509.ExtKeyUsageClientAuth)
	stranger, strangerKey := servers.Leaf("stranger", time.Now().Add(time.Hour), x509.ExtKeyUsageClientAuth)

	if name, err := dial(addr, client(good, goodKey)); err != nil || name != "worker" || <-handshakes != nil {
		t.Fatalf("client with a valid certificate: %q %v", name, err)
	}
	for _, c := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"no certificate", client("", "")},
		{"expired certificate", client(expired, expiredKey)},
		{"certificate from another CA", client(stranger, strangerKey)},
	} {
		// TLS 1.3: the client may finish its side before the server's
		// verdict; the server's handshake error is the verdict.
		dial(addr, c.cfg)
		if err := <-handshakes; err == nil {
			t.Errorf("%s: the server accepted it", c.name)
		}
	}
	// A client that does not trust the server's CA refuses it.
	other := tlstest.NewPKI(t, "other")
	r, _ := New(Files{CA: other.CAFile()})
	if _, err := dial(addr, r.ClientConfig()); err == nil {
		t.Error("a client trusting another CA accepted the server")
	}
	<-handshakes
}

// A server picks up a replaced certificate without a restart: on Reload
// (SIGHUP), and by itself when the file changes; a broken file keeps the
// previous certificate.
func TestReload(t *testing.T) {
	servers := tlstest.NewPKI(t, "servers")
	sc, sk := servers.Leaf("first", time.Now().Add(time.Hour), x509.ExtKeyUsageServerAuth)
	srv, err := New(Files{Cert: sc, Key: sk})
	if err != nil {
		t.Fatal(err)
	}
	addr, handshakes := serve(t, srv.ServerConfig())
	cr, _ := New(Files{CA: servers.CAFile()})
	name := func() string {
		t.Helper()
		n, err := dial(addr, cr.ClientConfig())
		if err != nil || <-handshakes != nil {
			t.Fatalf("dial: %v", err)
		}
		return n
	}
	if n := name(); n != "first" {
		t.Fatalf("serving %q", n)
	}
	replace := func(leaf string) {
		c, k := servers.Leaf(leaf, time.Now().Add(time.Hour), x509.ExtKeyUsageServerAuth)
		for _, f := range [][2]string{{c, sc}, {k, sk}} {
			b, _ := os.ReadFile(f[0])
			os.WriteFile(f[1], b, 0o600)
		}
	}
	replace("second")
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if n := name(); n != "second" {
		t.Fatalf("after Reload: serving %q", n)
	}
	// Changed on disk, no signal: seen at a handshake a second later.
	replace("third")
	future := time.Now().Add(2 * time.Second)
	os.Chtimes(sc, future, future)
	srv.mu.Lock()
	srv.check = time.Now().Add(-2 * time.Second)
	srv.mu.Unlock()
	if n := name(); n != "third" {
		t.Fatalf("after the files changed: serving %q", n)
	}
	// A broken file: the reload fails, the previous certificate stays.
	os.WriteFile(sc, []byte("not a certificate"), 0o600)
	if err := srv.Reload(); err == nil {
		t.Fatal("a broken certificate file reloaded")
	}
	if n := name(); n != "third" {
		t.Fatalf("after a failed reload: serving %q", n)
	}
}

// Package tlstest makes certificate authorities and certificates for
// tests (crypto/x509, ECDSA P-256), written as PEM files in a test's
// temporary folder.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// T is the part of testing.TB that a PKI uses.
type T interface {
	Fatal(args ...any)
	TempDir() string
}

// PKI makes certificates for tests: a CA, and leaves it signs.
type PKI struct {
	t      T
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// NewPKI makes a CA named name, valid for an hour.
func NewPKI(t T, name string) *PKI {
	p := &PKI{t: t, dir: t.TempDir()}
	p.caKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.write(name+"-ca.pem", "CERTIFICATE", der)
	p.serial = 1
	return p
}

func (p *PKI) write(name, typ string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// CAFile is the CA certificate's PEM file.
func (p *PKI) CAFile() string { return filepath.Join(p.dir, p.ca.Subject.CommonName+"-ca.pem") }

// Leaf writes a certificate and key for name, valid until notAfter, and
// returns their paths.
func (p *PKI) Leaf(name string, notAfter time.Time, usage x509.ExtKeyUsage) (cert, key string) {
	p.serial++
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{name}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	kd, _ := x509.MarshalECPrivateKey(k)
	return p.write(name+".pem", "CERTIFICATE", der), p.write(name+"-key.pem", "EC PRIVATE KEY", kd)
}

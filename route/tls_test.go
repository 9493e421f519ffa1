package route

import (
	"context"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tlsconf"
	"github.com/meshnet/shardd/internal/tlsconf/tlstest"
)

// A route over mutual TLS generates as over plaintext; a head without a
// client certificate, or one that does not trust the worker's CA, is
// refused at Dial.
func TestRouteOverMutualTLS(t *testing.T) {
	servers, clients := tlstest.NewPKI(t, "servers"), tlstest.NewPKI(t, "clients")
	sc, sk := servers.Leaf("worker", time.Now().Add(time.Hour), x509.ExtKeyUsageServerAuth)
	srvTLS, err := tlsconf.New(tlsconf.Files{Cert: sc, Key: sk, CA: clients.CAFile()})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvTLS.ServerConfig())))
	shardv1.RegisterShardRuntimeServer(srv, &ackWorker{window: 2, vocab: 50})
	go srv.Serve(lis)
	defer srv.Stop()
	addr := lis.Addr().String()

	head := func(files tlsconf.Files) Options {
		r, err := tlsconf.New(files)
		if err != nil {
			t.Fatal(err)
		}
		return Options{TLS: r.ClientConfig(), StepTimeout: 500 * time.Millisecond}
	}
	cc, ck := clients.Leaf("head", time.Now().Add(time.Hour), x509.ExtKeyUsageClientAuth)
	r, err := Dial(context.Background(), []string{addr}, head(tlsconf.Files{Cert: cc, Key: ck, CA: servers.CAFile()}))
	if err != nil {
		t.Fatal(err)
	}
	var toks []int32
	_, err = r.Generate(context.Background(), Request{Prompt: []int32{3, 4, 5}, MaxTokens: 4}, func(tok int32) error {
		toks = append(toks, tok)
		return nil
	})
	r.Close()
	if err != nil || len(toks) != 4 || toks[0] != 3 {
		t.Fatalf("over mutual TLS: %v %v", toks, err)
	}
	for name, files := range map[string]tlsconf.Files{
		"no client certificate":   {CA: servers.CAFile()},
		"worker's CA not trusted": {Cert: cc, Key: ck, CA: clients.CAFile()},
	} {
		if r, err := Dial(context.Background(), []string{addr}, head(files)); err == nil {
			r.Close()
			t.Errorf("%s: Dial succeeded", name)
		}
	}
	// Plaintext to a TLS worker fails too.
	if r, err := Dial(context.Background(), []string{addr}, Options{StepTimeout: 500 * time.Millisecond}); err == nil {
		r.Close()
		t.Error("plaintext head: Dial succeeded")
	}
}

package route

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/meshnet/shardd/bufpool"
	"github.com/meshnet/shardd/frames"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/internal/tlsconf"
	"github.com/meshnet/shardd/internal/tlsconf/tlstest"
	"github.com/meshnet/shardd/relay"
	"github.com/meshnet/shardd/stages/decode"
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

	head := func(files tlsconf.Files) Options { return tlsHead(t, files, 500*time.Millisecond) }
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

// A relayed hop runs TLS end to end through the relay: with mutual TLS it
// generates; the head checks the worker's certificate against the name it
// dials at the relay, so a worker registered under another name is
// refused, as is a head without a client certificate.
func TestRelayedHopOverMutualTLS(t *testing.T) {
	servers, clients := tlstest.NewPKI(t, "servers"), tlstest.NewPKI(t, "clients")
	sc, sk := servers.Leaf("worker-b", time.Now().Add(time.Hour), x509.ExtKeyUsageServerAuth)
	srvTLS, err := tlsconf.New(tlsconf.Files{Cert: sc, Key: sk, CA: clients.CAFile()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rl := &relay.Relay{WaitTimeout: 200 * time.Millisecond}
	go rl.Serve(ln)
	defer rl.Close()
	relayAddr := ln.Addr().String()
	fs := frames.NewServer(&ackWorker{window: 2, vocab: 50}, frames.Config{Codec: decode.Codec{Pool: bufpool.Default}, Pool: bufpool.Default, MaxRecv: 1 << 20})
	defer fs.Close()
	for _, name := range []string{"worker-b", "impostor"} {
		lis, err := relay.Listen(relayAddr, name, relay.ListenOptions{Idle: 2})
		if err != nil {
			t.Fatal(err)
		}
		go fs.Serve(tls.NewListener(lis, srvTLS.ServerConfig()))
	}
	head := func(files tlsconf.Files) Options { return tlsHead(t, files, 2*time.Second) }
	cc, ck := clients.Leaf("head", time.Now().Add(time.Hour), x509.ExtKeyUsageClientAuth)
	good := tlsconf.Files{Cert: cc, Key: ck, CA: servers.CAFile()}
	r, err := Dial(context.Background(), []string{"relay://" + relayAddr + "/worker-b"}, head(good))
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
		t.Fatalf("relayed over mutual TLS: %v %v", toks, err)
	}
	for name, c := range map[string]struct {
		hop   string
		files tlsconf.Files
	}{
		"certificate for another name": {"relay://" + relayAddr + "/impostor", good},
		"no client certificate":        {"relay://" + relayAddr + "/worker-b", tlsconf.Files{CA: servers.CAFile()}},
	} {
		if r, err := Dial(context.Background(), []string{c.hop}, head(c.files)); err == nil {
			r.Close()
			t.Errorf("%s: Dial succeeded", name)
		}
	}
}

// tlsHead is a head's options for TLS from files, with a step timeout.
func tlsHead(t *testing.T, files tlsconf.Files, step time.Duration) Options {
	t.Helper()
	r, err := tlsconf.New(files)
	if err != nil {
		t.Fatal(err)
	}
	return Options{TLS: r.ClientConfig(), StepTimeout: step}
}

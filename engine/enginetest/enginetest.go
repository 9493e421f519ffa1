// Package enginetest serves routes of test-double shards (backend/backendtest)
// with the real engine and gRPC on loopback, for the tests of the packages
// above the engine (route, load). Tests only.
package enginetest

import (
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/meshnet/shardd/backend/backendtest"
	"github.com/meshnet/shardd/engine"
	shardv1 "github.com/meshnet/shardd/gen/shardv1"
	"github.com/meshnet/shardd/gguf"
)

// T is the part of testing.TB that ServeRoute uses.
type T interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
}

// ServeRoute serves a route of n shards (one layer each) whose forwards
// take d (backendtest.NewDelay) and returns the workers' addresses in layer
// order. Everything stops when the test ends.
func ServeRoute(t T, n int, d time.Duration, cfg engine.Config) []string {
	t.Helper()
	var addrs []string
	for i := range n {
		addr, _ := ServeShard(t, i, n, d, cfg)
		addrs = append(addrs, addr)
	}
	return addrs
}

// ServeShard serves shard i of a route of n (as ServeRoute does) and
// returns its address and a stop that ends it at once, as a worker that
// dies: its connections are cut and its address refuses them. The same
// shard served twice computes the same outputs (a standby).
func ServeShard(t T, i, n int, d time.Duration, cfg engine.Config) (addr string, stop func()) {
	t.Helper()
	return ServeFake(t, i, n, backendtest.NewDelay(i == 0, i == n-1, d), cfg)
}

// ServeFake serves shard i of a route of n as ServeShard does, on the
// test double be (whose Gate or Entered the test may hold).
func ServeFake(t T, i, n int, be *backendtest.Fake, cfg engine.Config) (addr string, stop func()) {
	t.Helper()
	meta := gguf.Meta{Arch: "llama", BlockCount: 1, Start: i, End: i + 1, Total: n, FileType: "f32",
		SourceDigest: "00000000000000000000000000000000000000000000000000000000000000aa"}
	eng := engine.New(cfg, be, meta, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if eng.State() != shardv1.ServingState_SERVING_STATE_SERVING {
		t.Fatalf("enginetest: shard %d is not serving", i)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("enginetest: %v", err)
	}
	srv := grpc.NewServer(eng.ServerOptions()...)
	shardv1.RegisterShardRuntimeServer(srv, eng)
	go srv.Serve(lis)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			srv.Stop()
			eng.Close()
		})
	}
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

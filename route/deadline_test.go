package route

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	shardv1 "github.com/meshnet/shardd/gen/shardv1"
)

// A hop nobody answers on fails Dial within the step timeout with
// ErrUnreachable, however long the caller's context allows.
func TestDialUnreachable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close() // nothing listens there now
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = Dial(ctx, []string{addr}, Options{StepTimeout: 300 * time.Millisecond})
	if !errors.Is(err, ErrUnreachable) || time.Since(start) > 10*time.Second {
		t.Fatalf("after %v: %v, want ErrUnreachable within the step timeout", time.Since(start), err)
	}
}

// A worker that goes away mid-generation and does not come back fails the
// generation within (retries+1) x the step timeout, with ErrUnreachable.
func TestGenerateWorkerGone(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	shardv1.RegisterShardRuntimeServer(srv, &ackWorker{window: 1, vocab: 50})
	go srv.Serve(lis)
	r, err := Dial(context.Background(), []string{lis.Addr().String()}, Options{StepTimeout: 300 * time.Millisecond, Retries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var gone time.Time
	_, err = r.Generate(ctx, Request{Prompt: []int32{3}, MaxTokens: 100}, func(int32) error {
		if gone.IsZero() {
			srv.Stop()
			gone = time.Now()
		}
		return nil
	})
	if !errors.Is(err, ErrUnreachable) || time.Since(gone) > 10*time.Second {
		t.Fatalf("%v after the worker went: %v, want ErrUnreachable", time.Since(gone), err)
	}
}

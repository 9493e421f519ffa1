package main

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/meshnet/shardd/relay"
)

func init() {
	register(command{name: "relay", summary: "join heads and workers that cannot reach each other: pair their connections, copy bytes", run: runRelay})
}

func runRelay(args []string) error {
	fs := newFlags("relay", "--listen ADDR [--latency D] [--stall-every D --stall-for D]",
		"Accepts connections from workers ('shardd serve --relay ADDR/NAME', which dial out and\n"+
			"register as NAME) and from heads (hops written relay://ADDR/NAME), pairs each head with an\n"+
			"idle registration of its NAME and copies bytes both ways without parsing them: frames,\n"+
			"deadlines, identity and TLS (when the head and worker use it) pass through end to end.\n"+
			"--latency, --stall-every and --stall-for shape the forwarding, for tests and demos.")
	listen := fs.String("listen", "127.0.0.1:7000", "address to listen on")
	latency := fs.Duration("latency", 0, "delay added to every chunk of bytes, each way")
	stallEvery := fs.Duration("stall-every", 0, "stop all forwarding once every this long (0: never)")
	stallFor := fs.Duration("stall-for", 100*time.Millisecond, "how long each stall lasts")
	wait := fs.Duration("wait", 10*time.Second, "how long a head waits for its worker to register")
	maxConns := fs.Int("max-conns", 4096, "open connections at most (paired, idle or unidentified); one more is closed at once")
	maxIdle := fs.Int("max-idle", 64, "idle registrations of one name at most")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(*logLevel)
	if err != nil {
		return err
	}
	if *latency < 0 || *stallEvery < 0 || *stallFor < 0 || *wait <= 0 {
		return fmt.Errorf("durations must not be negative, and --wait must be positive")
	}
	if *maxConns < 1 || *maxIdle < 1 {
		return fmt.Errorf("--max-conns and --max-idle must be positive")
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	r := &relay.Relay{Latency: *latency, StallEvery: *stallEvery, StallFor: *stallFor, WaitTimeout: *wait,
		MaxConns: *maxConns, MaxIdle: *maxIdle, Log: log}
	log.Info("relaying", "listen", ln.Addr().String(), "latency", *latency, "stall_every", *stallEvery)
	// A line scripts wait for.
	fmt.Printf("shardd: relay on %s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- r.Serve(ln) }()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errc:
		return err
	case s := <-sig:
		log.Info("stopping", "signal", s.String())
	}
	r.Close()
	st := r.Stats()
	log.Info("stopped", "paired", st.Paired, "refused", st.Refused, "bytes_to_workers", st.BytesToWorker, "bytes_to_heads", st.BytesToHead)
	return nil
}

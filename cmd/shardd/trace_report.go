package main

import (
	"fmt"
	"os"

	"github.com/meshnet/shardd/telemetry"
)

func init() {
	register(command{name: "trace-report", summary: "per-hop, per-stage latency from exported spans: which hop is slow, and where", run: runTraceReport})
}

func runTraceReport(args []string) error {
	fs := newFlags("trace-report", "FILE.jsonl [FILE...]",
		"Reads spans written with --traces file:PATH (by workers and the head) and prints p50/p99 per hop\nand stage, then the hops ranked by step p99 with the stage where each spends most time and how\nfast its core ran (from its forward spans: a slow hop on a slow core is the host's), each\nworker's idle between forwards by what came next, and each crossing of a decode group from one\nworker to the next in parts: the sender's frame-out, the relay through the head and the wire,\nthe wait for the receiver's forward.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("want at least one span file")
	}
	spans, err := telemetry.ReadSpans(fs.Args()...)
	if err != nil {
		return err
	}
	telemetry.Report(os.Stdout, spans)
	return nil
}

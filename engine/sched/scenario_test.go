package sched

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
)

// TestScenarios runs the scheduler's scenarios in testdata/, one file per
// rule, in the style of etcd raft's interaction tests: each command drives
// a script (script_test.go) and its output is compared with the file's.
// `go test -run TestScenarios -rewrite` writes the outputs afresh (read
// the diff before committing it). The commands:
//
//	new [iteration-tokens=N] [prefill-iteration-tokens=N] [decode-budget=D]
//	    [decode-quiet=D] [decode-groups=N] [max-sessions=N] [exact]
//	    [max-seqs=N] [max-batch=N] [ctx-tokens=N]
//	                     a fresh scheduler (D: a duration, or -1 for off)
//	submit               one item a line: "<session> <tokens> [streamed|of=K]",
//	                     tokens 0 for a decode step; streamed: not final;
//	                     of=K: not final, K chunks of this size left
//	prefilled n=N        each session named in the input runs a prompt of
//	                     N tokens and is answered
//	decode-every-ms id=S S decodes alone, a step a millisecond, until the
//	                     cost model is trusted
//	plan [seqs]          the next iteration: "a:d1 b:p7" (session, decode
//	                     or prefill, rows), "wait 3ms", or "idle"; marked
//	                     (preemptible); seqs: each row's KV sequence
//	run [took=D]         the planned forward takes D (default: the
//	                     script's cost line)
//	step [took=D] [n=K]  plan and run, K times, a plan a line
//	drain [took=D]       step until nothing is queued, plans joined by |
//	wait-out             plan, moving the clock past each hold, until an
//	                     iteration runs; prints the holds and the plan
//	advance by=D         move the clock
//	replies              what each session named in the input was answered
//	cancel id=S          cancel S's queued work
//	resend id=S          S's next submit starts again at step 1, position 0
//	preempt              the planned forward is preempted; prints the trims
func TestScenarios(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var sc *script
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				sc = newScenario(t, d)
				return ""
			}
			if sc == nil {
				d.Fatalf(t, "%s before new", d.Cmd)
			}
			sc.t = t
			return sc.command(t, d)
		})
	})
}

// newScenario makes the script a new command asks for.
func newScenario(t *testing.T, d *datadriven.TestData) *script {
	var cfg Config
	var info Info
	ints := map[string]*int{
		"iteration-tokens": &cfg.IterationTokens, "prefill-iteration-tokens": &cfg.PrefillIterationTokens,
		"decode-groups": &cfg.DecodeGroups, "max-sessions": &cfg.MaxSessions,
		"max-seqs": &info.MaxSeqs, "max-batch": &info.MaxBatch, "ctx-tokens": &info.CtxTokens,
	}
	durs := map[string]*time.Duration{"decode-budget": &cfg.DecodeBudget, "decode-quiet": &cfg.DecodeQuiet}
	for _, a := range d.CmdArgs {
		switch {
		case a.Key == "exact":
			cfg.Exact = true
		case ints[a.Key] != nil:
			*ints[a.Key] = atoi(t, d, a.Vals[0])
		case durs[a.Key] != nil:
			*durs[a.Key] = duration(t, d, a.Vals[0])
		default:
			d.Fatalf(t, "new: unknown argument %s", a.Key)
		}
	}
	return newScript(t, cfg, func(i *Info) {
		for _, f := range []struct{ set, to *int }{{&info.MaxSeqs, &i.MaxSeqs}, {&info.MaxBatch, &i.MaxBatch}, {&info.CtxTokens, &i.CtxTokens}} {
			if *f.set != 0 {
				*f.to = *f.set
			}
		}
	})
}

// command runs one command of a scenario and returns its output.
func (sc *script) command(t *testing.T, d *datadriven.TestData) string {
	took := time.Duration(0)
	if d.HasArg("took") {
		took = duration(t, d, arg(t, d, "took"))
	}
	switch d.Cmd {
	case "submit":
		for _, line := range lines(d) {
			f := strings.Fields(line)
			it := sc.make(f[0], atoi(t, d, f[1]))
			if len(f) > 2 {
				it.Final = false // streamed: where the prompt ends is not known
				if k, ok := strings.CutPrefix(f[2], "of="); ok {
					it.PromptEnd = it.First + it.Tokens*atoi(t, d, k)
				}
			}
			sc.queue(it)
		}
	case "prefilled":
		sc.prefilled(atoi(t, d, arg(t, d, "n")), strings.Fields(d.Input)...)
	case "decode-every-ms":
		sc.decodeEveryMs(arg(t, d, "id"))
	case "plan":
		return sc.describe(sc.plan(), d.HasArg("seqs"))
	case "run":
		sc.run(took)
	case "step":
		n := 1
		if d.HasArg("n") {
			n = atoi(t, d, arg(t, d, "n"))
		}
		var out []string
		for range n {
			out = append(out, sc.describe(sc.step(took), false))
		}
		return strings.Join(out, "\n")
	case "drain":
		var out []string
		for i := 0; sc.s.pending > 0; i++ {
			if i == 64 {
				d.Fatalf(t, "still %d queued after 64 iterations", sc.s.pending)
			}
			out = append(out, sc.step(took))
		}
		return strings.Join(out, " | ")
	case "wait-out":
		holds := 0
		p := sc.plan()
		for ; strings.HasPrefix(p, "wait ") && holds < 64; p = sc.plan() {
			holds++
			sc.now = sc.s.wake.Add(time.Millisecond)
		}
		return fmt.Sprintf("%d holds, then %s", holds, sc.describe(p, false))
	case "advance":
		sc.now = sc.now.Add(duration(t, d, arg(t, d, "by")))
	case "replies":
		var out []string
		for _, id := range strings.Fields(d.Input) {
			out = append(out, id+": "+sc.replies(id))
		}
		return strings.Join(out, "\n")
	case "cancel":
		n := sc.s.Cancel(sc.now, arg(t, d, "id"), 1, "")
		sc.settle()
		return fmt.Sprintf("cancelled %d", n)
	case "resend":
		p := sc.next[arg(t, d, "id")]
		p.step, p.pos = 0, 0
	case "preempt":
		sc.s.Advance(sc.now, Outcome{Took: time.Millisecond, Preempted: true})
		sc.settle()
		var out []string
		for _, tr := range sc.trims {
			out = append(out, fmt.Sprintf("trim seq %d from %d", tr.Seq, tr.Pos))
		}
		return strings.Join(out, "\n")
	default:
		d.Fatalf(t, "unknown command %s", d.Cmd)
	}
	return ""
}

// describe adds to a plan whether it is preemptible and, with seqs, the
// KV sequence of each row.
func (sc *script) describe(p string, seqs bool) string {
	if strings.HasPrefix(p, "wait") || p == "idle" {
		return p
	}
	if seqs {
		var s []string
		for _, it := range sc.fp.Items {
			s = append(s, strconv.Itoa(it.Item.Seq))
		}
		p += " seqs " + strings.Join(s, ",")
	}
	if sc.fp.Preemptible {
		p += " (preemptible)"
	}
	return p
}

func lines(d *datadriven.TestData) []string {
	var out []string
	for _, l := range strings.Split(d.Input, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func arg(t *testing.T, d *datadriven.TestData, key string) string {
	var v string
	d.ScanArgs(t, key, &v)
	return v
}

func atoi(t *testing.T, d *datadriven.TestData, s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return n
}

// duration reads a duration; -1 is off (a negative setting).
func duration(t *testing.T, d *datadriven.TestData, s string) time.Duration {
	if s == "-1" {
		return -1
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return v
}

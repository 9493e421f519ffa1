// Command shardd is a pipeline-parallel LLM inference worker: it serves one
// contiguous layer range of a GGUF model with llama.cpp and exchanges
// activations with its peers over the Shard data plane (gRPC, package
// meshnet.shard.v1). It also carries the tools to make, split, inspect and
// verify the models it serves.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

type command struct {
	name, args, summary string
	run                 func(args []string) error
}

var commands []command

func register(c command) { commands = append(commands, c) }

func usage(w io.Writer) {
	fmt.Fprintf(w, "shardd: a worker that serves one layer range of a GGUF model over the Shard data plane.\n\n")
	fmt.Fprintf(w, "Usage: shardd COMMAND [flags]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "\nRun 'shardd COMMAND -h' for a command's flags.\n")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage(os.Stdout)
		return
	}
	for _, c := range commands {
		if c.name == os.Args[1] {
			if err := c.run(os.Args[2:]); err != nil {
				if err == flag.ErrHelp {
					return
				}
				fmt.Fprintf(os.Stderr, "shardd %s: %v\n", c.name, err)
				os.Exit(1)
			}
			return
		}
	}
	fmt.Fprintf(os.Stderr, "shardd: unknown command %q\n\n", os.Args[1])
	usage(os.Stderr)
	os.Exit(2)
}

// newFlags returns a flag set whose -h prints the command's usage.
func newFlags(name, args, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: shardd %s %s\n\n%s\n\nFlags:\n", name, args, summary)
		fs.PrintDefaults()
	}
	return fs
}

// required reports the named flags that are empty.
func required(fs *flag.FlagSet, names ...string) error {
	var missing []string
	for _, n := range names {
		if f := fs.Lookup(n); f != nil && f.Value.String() == "" {
			missing = append(missing, "--"+n)
		}
	}
	if len(missing) > 0 {
		fs.Usage()
		return fmt.Errorf("missing %s", strings.Join(missing, ", "))
	}
	return nil
}

package main

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshnet/shardd/gguf"
)

// startLine starts bin with args and returns the process and the text
// after prefix on the first stdout line that has it.
func startLine(t *testing.T, bin, prefix string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
				found <- v
			}
		}
	}()
	select {
	case v := <-found:
		return v
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s %v: no %q line: %s", bin, args, prefix, stderr.String())
	}
	return ""
}

// The relay as an operator runs it: `shardd relay`, a worker that
// registers there with `serve --relay`, and `generate` with a relay://
// hop beside a direct one, checked against the whole model.
func TestRelayCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds shardd and runs real processes")
	}
	dir := t.TempDir()
	bin, model := buildShardd(t, dir), tinyModel(t, dir)
	shards, err := gguf.Split(model, gguf.EvenRanges(6, 2), dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	relayAddr := startLine(t, bin, "shardd: relay on ", "relay", "--listen", "127.0.0.1:0")
	direct := startLine(t, bin, "shardd: listening on ", "serve", "--model", shards[0], "--listen", "127.0.0.1:0", "--threads", "1")
	relayed := startLine(t, bin, "shardd: relayed as ", "serve", "--model", shards[1], "--listen", "127.0.0.1:0", "--threads", "1",
		"--relay", relayAddr+"/second")
	if want := "relay://" + relayAddr + "/second"; relayed != want {
		t.Fatalf("relayed as %q, want %q", relayed, want)
	}
	out, err := exec.Command(bin, "generate", "--route", direct+","+relayed, "--prompt-tokens", "1,2,3", "--max-tokens", "16",
		"--verify-model", filepath.Join(dir, "tiny.gguf")).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "match:") {
		t.Fatalf("generate through the relay: %v\n%s", err, out)
	}
}

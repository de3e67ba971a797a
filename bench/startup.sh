#!/usr/bin/env bash
# Session start-up with and without the optimised-graph cache, side by side (docs/benchmarks.md).
#
#   bench/startup.sh [MODEL] [ROUNDS]        (defaults: models/full-export, 3)
#
# Each round runs `cosy profile` three times, in this order, so that load from other processes hits
# all three alike: "off" (runtime.graph_cache_enabled = false: optimise at load, save nothing),
# "cold" (a fresh cache folder: optimise and save) and "warm" (the same folder again: load the saved
# graphs). Writes out/startup-bench/<setting><round>.json and prints the session load times.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-models/full-export}"
rounds="${2:-3}"
cosy="${COSY_BIN:-target/release/cosy}"
out=out/startup-bench
rm -rf "$out"
mkdir -p "$out"

run() { # NAME ARGS...
  local name=$1
  shift
  echo "== $name (load average $(cut -d' ' -f1-3 /proc/loadavg))"
  "$cosy" --model "$model" --provider cpu --precision fp32 "$@" profile "Hello there." \
    --prompt-wav tests/fixtures/prompt_24k.wav --prompt-text "This recording is the voice prompt." \
    --no-text-frontend --min-tokens 25 --runs 1 --warmup 0 --json "$out/$name.json" >"$out/$name.txt" 2>&1
  sed -n '/^session load/,/^$/p' "$out/$name.txt"
}

for r in $(seq 1 "$rounds"); do
  run "off$r" --set runtime.graph_cache_enabled=false
  run "cold$r" --set runtime.graph_cache="$out/graphs$r"
  run "warm$r" --set runtime.graph_cache="$out/graphs$r"
done

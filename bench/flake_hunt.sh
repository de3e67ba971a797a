#!/usr/bin/env bash
# Flake hunt: runs every Rust test binary of the project ROUNDS times (default 20) with two
# CPU-bound processes beside it, as on a busy CI machine, and lists every failing run. A test that
# fails once here depends on timing or on which thread runs first: fix it with a hook, a barrier
# or a wait on the event it needs (docs/architecture.md, "Tests"), never by loosening the check.
#
#   bench/flake_hunt.sh [ROUNDS] [FILTER] [TEST ARGS…]
#     FILTER: only binaries whose name (e.g. test-serve, lib-cosy) matches (grep -E);
#     TEST ARGS: passed to each binary (a test name filter such as limits::)
#
# Round after round (every binary once per round), so an interrupted hunt has covered every binary
# evenly. Logs: $HUNT_DIR (default target/flake-hunt/): `summary` has a line per run, a failing
# run's whole output is kept as NAME.ROUND.log. Bounded: ROUNDS × the suite's time (about 45 min a
# round on a 2-core machine under this load, most of it the pipeline, serve and cli binaries).
set -uo pipefail
cd "$(dirname "$0")/.."
rounds="${1:-20}"
filter="${2:-.}"
shift $(( $# < 2 ? $# : 2 ))
out="${HUNT_DIR:-target/flake-hunt}"
mkdir -p "$out"
cargo test --all-targets --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] and m["target"]["kind"][0] != "example":
        print(m["target"]["kind"][0] + "-" + m["target"]["name"], m["executable"])
' | grep -E "$filter" > "$out/binaries"
# What `cargo test` gives a test binary besides its arguments.
export CARGO_MANIFEST_DIR="$PWD" CARGO_PKG_NAME=cosy CI="${CI:-true}"
export COSY_VENV="${COSY_VENV:-$HOME/.cache/cosy/venv}"
hogs=()
for _ in 1 2; do ( while :; do :; done ) & hogs+=($!); done
trap 'kill "${hogs[@]}" 2>/dev/null' EXIT
for round in $(seq "$rounds"); do
  while read -r name bin; do
    start=$(date +%s)
    if "$bin" "$@" < /dev/null > "$out/$name.$round.log" 2>&1; then
      echo "$(date +%T) PASS $name round $round ($(( $(date +%s) - start )) s)" >> "$out/summary"
      rm -f "$out/$name.$round.log"
    else
      failed=$(grep -E '^test .* FAILED|panicked' "$out/$name.$round.log" | head -3 | tr '\n' ' ')
      echo "$(date +%T) FAIL $name round $round ($(( $(date +%s) - start )) s): $failed" >> "$out/summary"
    fi
  done < "$out/binaries"
done
echo "$(date +%T) done: $(grep -c ' PASS ' "$out/summary") passed, $(grep -c ' FAIL ' "$out/summary") failed runs" >> "$out/summary"
tail -1 "$out/summary"

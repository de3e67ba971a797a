#!/usr/bin/env bash
# Load benchmark of `cosy serve` (issue 11): starts the release server on a free loopback port
# with MODEL_DIR and a voice "me" made from the bundled prompt, then for each level c runs c
# streaming clients (examples/serve_load.rs) and prints one JSON line per level and a table.
# At c = 1 the same request is also timed through the engine in-process (server overhead).
#
#   bench/serve_load.sh MODEL_DIR [OUT.jsonl] [-- extra server args, e.g. --set runtime.precision=int8]
#   LEVELS="1 2 4 8 16" REQUESTS=8 TEXT="..." bench/serve_load.sh tests/fixtures/tiny
# MIN_TOKENS=N forces N speech tokens per request (the server then runs with debug.test_hooks):
# random weights otherwise stop after a token or two, and the load is not the load of speech.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ $# -lt 1 ]; then echo "usage: bench/serve_load.sh MODEL_DIR [OUT.jsonl] [-- server args]" >&2; exit 2; fi
model="$1"; shift
out="bench/serve-load-results.jsonl"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then out="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
levels="${LEVELS:-1 2 4 8 16}"; requests="${REQUESTS:-8}"; min_tokens="${MIN_TOKENS:-}"
text="${TEXT:-Hello there, how are you today?}"
# BENCH_PREBUILT=1: use the binaries already in target/release (a GPU host without cargo).
[ -n "${BENCH_PREBUILT:-}" ] || cargo build --release --quiet --bin cosy --example serve_load
work="$(mktemp -d)"; pid=""
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
export COSY_GRAPH_CACHE="$work/gc"
cosy=(target/release/cosy --model "$model" --set "voices.dir=$work/voices" "$@")
[ -n "$min_tokens" ] && cosy+=(--set debug.test_hooks=true)
"${cosy[@]}" voice add me --wav tests/fixtures/prompt_24k.wav --text "This recording is the voice prompt." --default >/dev/null
"${cosy[@]}" --set engine.max_in_flight=64 --set engine.max_queue=256 serve --bind 127.0.0.1:0 2>"$work/server.log" &
pid=$!
until grep -q "listening on" "$work/server.log"; do sleep 0.1; done
url="$(grep -o 'http://[0-9.:]*' "$work/server.log" | head -1)"
until curl -sf "$url/ready" >/dev/null; do sleep 0.2; done
: > "$out"
for c in $levels; do
  # --set pairs of the server reach --in-process as --set KEY=VALUE.
  args=(--url "$url" --concurrency "$c" --requests "$requests" --text "$text")
  [ -n "$min_tokens" ] && args+=(--min-tokens "$min_tokens")
  if [ "$c" = 1 ]; then
    args+=(--in-process "$model" --voices "$work/voices")
    set_next=0
    for s in "$@"; do
      if [ "$set_next" = 1 ]; then args+=(--set "$s"); set_next=0; elif [ "$s" = "--set" ]; then set_next=1; fi
    done
  fi
  target/release/examples/serve_load "${args[@]}" | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| c | requests | errors | TTFB p50 ms | p95 ms | p99 ms | audio-s/s | ×c=1 | paired: in-process / server TTFB p50 ms | server overhead p50 ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
base = rows[0]["audio_s_per_s"] if rows else 1
for r in rows:
    ov = r.get("server_overhead_p50_ms")
    ip = None if ov is None else f"{r['paired_in_process_ttfb_p50_ms']:.1f} / {r['paired_server_ttfb_p50_ms']:.1f}"
    print(f"| {r['concurrency']} | {r['requests']} | {r['errors']} | {r['ttfb_p50_ms']:.1f} | {r['ttfb_p95_ms']:.1f} | {r['ttfb_p99_ms']:.1f} "
          f"| {r['audio_s_per_s']:.3f} | {r['audio_s_per_s'] / base:.2f} | {'–' if ip is None else ip} | {'–' if ov is None else f'{ov:+.1f}'} |")
PY

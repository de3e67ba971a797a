#!/usr/bin/env bash
# Engine concurrency matrix (issue 10): for each mode and concurrency level, one process loads the
# model, warms up with one request, then submits c requests at once (each forced to --tokens
# speech tokens) and prints one JSON line (examples/concurrency.rs). A markdown table follows.
#
#   bench/concurrency.sh MODEL_DIR [OUT.jsonl] [-- extra example args, e.g. --set runtime.precision=int8]
#   LEVELS="1 2 4 8 16" MODES="offline streaming" TOKENS=100 bench/concurrency.sh models/full-export
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ $# -lt 1 ]; then echo "usage: bench/concurrency.sh MODEL_DIR [OUT.jsonl] [-- args]" >&2; exit 2; fi
model="$1"; shift
out="bench/concurrency-results.jsonl"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then out="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
levels="${LEVELS:-1 2 4 8 16}"; modes="${MODES:-offline streaming}"; tokens="${TOKENS:-100}"
# BENCH_PREBUILT=1: use the binaries already in target/release (a GPU host without cargo).
[ -n "${BENCH_PREBUILT:-}" ] || cargo build --release --quiet --example concurrency
: > "$out"
for mode in $modes; do
  for c in $levels; do
    target/release/examples/concurrency --model "$model" --concurrency "$c" --tokens "$tokens" --mode "$mode" "$@" | tee -a "$out"
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| mode | c | LLM decode tok/s | ×c=1 | LLM phase tok/s | ×c=1 | audio-s/s | ×c=1 | TTFB p50 s | TTFB p95 s | peak RSS MiB | LLM rows/call | DiT req/call |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
base = {}
def f(v, fmt):
    return "–" if v is None or v != v else format(v, fmt)
for r in rows:
    b = base.setdefault(r["mode"], r)
    print(f"| {r['mode']} | {r['concurrency']} | {r['llm_decode_tokens_per_s']:.1f} | {r['llm_decode_tokens_per_s'] / b['llm_decode_tokens_per_s']:.2f} "
          f"| {r['llm_tokens_per_s']:.1f} | {r['llm_tokens_per_s'] / b['llm_tokens_per_s']:.2f} "
          f"| {r['audio_s_per_s']:.3f} | {r['audio_s_per_s'] / max(b['audio_s_per_s'], 1e-12):.2f} | {f(r['ttfb_p50_s'], '.2f')} | {f(r['ttfb_p95_s'], '.2f')} "
          f"| {r['peak_rss_mib']:.0f} | {r['llm_rows_per_call']:.2f} | {r['dit_requests_per_call']:.2f} |")
PY

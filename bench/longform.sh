#!/usr/bin/env bash
# Long-form job throughput (issue 33, point 5): sentences per second of a job said one sentence
# at a time against N sentences in flight (the engine's batching), on one model folder. Each run
# is its own process (examples/longform.rs): the model loaded and warmed, then a fresh job of
# SENTENCES sentences, each forced to TOKENS speech tokens, timed; one JSON line each, then a
# table.
#
#   bench/longform.sh MODEL_DIR [OUT.jsonl] [-- KEY=VALUE ...]
#   LEVELS="1 2 4 8" SENTENCES=48 TOKENS=100 bench/longform.sh /work/models/full-export
#   PROFILE=debug bench/longform.sh tests/fixtures/tiny      (no release build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
if [ $# -lt 1 ]; then echo "usage: bench/longform.sh MODEL_DIR [OUT.jsonl] [-- KEY=VALUE ...]" >&2; exit 2; fi
model="$1"; shift
out="bench/longform-results.jsonl"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then out="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
levels="${LEVELS:-1 4}"; sentences="${SENTENCES:-24}"; tokens="${TOKENS:-60}"; profile="${PROFILE:-release}"
# BENCH_PREBUILT=1: use the example already built (a GPU host without cargo).
if [ -z "${BENCH_PREBUILT:-}" ]; then
  if [ "$profile" = release ]; then cargo build --release --quiet --example longform; else cargo build --quiet --example longform; fi
fi
: > "$out"
for n in $levels; do
  "target/$profile/examples/longform" "$model" "$n" "$sentences" "$tokens" "$@" | tee -a "$out"
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| in flight | sentences | s | sentences/s | ×1 | audio-s/s | LLM decode calls | DiT calls | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|")
base = rows[0]["sentences_per_s"] if rows else 1
for r in rows:
    print(f"| {r['in_flight']} | {r['sentences']} | {r['seconds']:.1f} | {r['sentences_per_s']:.2f} | {r['sentences_per_s'] / base:.2f} "
          f"| {r['audio_s_per_s']:.2f} | {r['llm_decode_calls']} | {r['dit_calls']} | {r['peak_rss_mib'] or 0:.0f} |")
PY

#!/usr/bin/env bash
# Peak memory of `cosy file BOOK` against the book's length (issue 33: "memory stays flat for a
# 500-page book"). Writes Markdown books of each PAGES pages (30 sentences a page, 25 chapters),
# says each into a FLAC file with SRT captions through a fresh job folder, and prints the peak
# RSS (/usr/bin/time) beside the sentences and the audio. Each sentence is forced to TOKENS
# speech tokens (the hidden test hook), so the run measures the job's own memory (plan, captions,
# the sentence files read back into the encoder) rather than the model's speed.
#
#   bench/book_rss.sh [MODEL_DIR] [-- KEY=VALUE ...]       (default: the tiny test model)
#   PAGES="50 500" TOKENS=2 COSY=target/release/cosy bench/book_rss.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
model="${1:-tests/fixtures/tiny}"; [ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
pages="${PAGES:-50 500}"; tokens="${TOKENS:-2}"; cosy="${COSY:-target/release/cosy}"
[ -x "$cosy" ] || { echo "book_rss.sh: $cosy is not built (cargo build --release)" >&2; exit 2; }
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
sets=(--set debug.test_hooks=true --set "runtime.engine_cache=$work/cache")
for kv in "$@"; do sets+=(--set "$kv"); done
printf '| pages | chapters | sentences | audio h | wall s | peak RSS MiB |\n|---|---|---|---|---|---|\n'
for n in $pages; do
  book="$work/book-$n.md"
  python3 - "$n" "$book" <<'PY'
import sys
pages, path = int(sys.argv[1]), sys.argv[2]
words = ["lighthouse", "harbour", "keeper", "lantern", "evening", "northern", "quiet", "water", "stairs", "window"]
sentences = pages * 30
chapters = 25
with open(path, "w") as f:
    f.write(f"# A book of {pages} pages\n\n")
    for c in range(chapters):
        f.write(f"## Chapter {c + 1}\n\n")
        share = sentences // chapters
        for s in range(share):
            w = [words[(c * 7 + s * 3 + k) % len(words)] for k in range(8)]
            f.write(f"The {w[0]} and the {w[1]} saw the {w[2]} by the {w[3]} {w[4]}. ")
            if s % 10 == 9:
                f.write("\n\n")
        f.write("\n\n")
PY
  count=$(grep -o '\. ' "$book" | wc -l)
  start=$(date +%s.%N)
  /usr/bin/time -f '%M' -o "$work/rss-$n" "$cosy" --model "$model" --provider cpu "${sets[@]}" \
    file "$book" -o "$work/book-$n.flac" --captions "$work/book-$n.srt" --job "$work/job-$n" --min-tokens "$tokens" --max-tokens "$tokens" \
    --prompt-wav tests/fixtures/prompt_24k.wav --prompt-text "This recording is the voice prompt." 2>"$work/err-$n" \
    || { echo "book_rss.sh: cosy failed on the $n-page book:" >&2; tail -5 "$work/err-$n" >&2; exit 1; }
  wall=$(python3 -c "import time; print(f'{time.time() - $start:.0f}')")
  hours=$(python3 -c "import subprocess, sys; d = subprocess.run(['ffprobe', '-v', 'error', '-show_entries', 'format=duration', '-of', 'csv=p=0', sys.argv[1]], capture_output=True, text=True).stdout; print(f'{float(d) / 3600:.2f}')" "$work/book-$n.flac")
  rss=$(( $(cat "$work/rss-$n") / 1024 ))
  echo "| $n | 25 | $count | $hours | $wall | $rss |"
done

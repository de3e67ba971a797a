#!/usr/bin/env bash
# First audio of `cosy say`, cold (`--local`: the model is loaded by the command) against warm (a
# running `cosy serve` found on the per-user socket), side by side (docs/benchmarks.md, "`cosy say`
# with a warm local server"; docs/desktop.md).
#
#   bench/say_warm.sh [MODEL] [ROUNDS] [SAY FLAGS…]   (defaults: tests/fixtures/tiny, 3)
#   PROVIDER=cuda PRECISION=fp16 bench/say_warm.sh MODEL 2   (on a GPU; bench/gpu.sh runs it so)
#
# SAY FLAGS go to every `say` run, cold and warm alike (e.g. --no-buffering: first audio without
# the buffering rule, which holds playback on a machine too busy to keep up with real time).
#
# Times come from each run's event log: `first_audio_ms` (from the start of the command's work to
# the device's first samples) on ALSA's null device, plus the whole command's wall time. Each round
# runs cold then warm with the same text, voice and seed. The server and every `say` run with a HOME
# and XDG_RUNTIME_DIR of their own under out/say-warm-bench (no other server is found).
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-tests/fixtures/tiny}"
rounds="${2:-3}"
shift $(( $# < 2 ? $# : 2 ))
say_flags=("$@")
cosy="$(realpath "${COSY_BIN:-target/release/cosy}")"
provider="${PROVIDER:-cpu}"
precision="${PRECISION:-fp32}"
out="$PWD/out/say-warm-bench"
text="The old lighthouse blinked twice before the fog rolled in."
rm -rf "$out"
mkdir -p "$out/home" "$out/run"
chmod 700 "$out/run"
for v in $(env | grep -o '^COSY_[A-Z_]*' || true); do unset "$v"; done
export HOME="$out/home" XDG_RUNTIME_DIR="$out/run" COSY_GRAPH_CACHE="$out/graphs"
printf 'pcm.!default { type null }\n' >"$HOME/.asoundrc"
common=(--model "$(realpath "$model")" --provider "$provider" --precision "$precision" --set "voices.dir=$out/voices")

"$cosy" "${common[@]}" -q voice add me --wav tests/fixtures/prompt_24k.wav --text "Hello there, this is a test." --default
"$cosy" "${common[@]}" serve --bind 127.0.0.1:0 2>"$out/serve.log" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "ready" "$out/serve.log" && break
  kill -0 $server 2>/dev/null || { cat "$out/serve.log"; exit 1; }
  sleep 0.5
done
grep -q "local socket" "$out/serve.log" || { echo "the server has no local socket:"; cat "$out/serve.log"; exit 1; }

ms_now() { date +%s%3N; }
first_audio() { sed -n 's/^[0-9]* first_audio_ms //p' "$1"; }
echo "model $model, $provider $precision, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), say flags: ${say_flags[*]:-none}"
printf '%-6s %-5s %16s %12s\n' round path first_audio_ms wall_ms
for r in $(seq 1 "$rounds"); do
  for path in cold warm; do
    flag=()
    [ "$path" = cold ] && flag=(--local)
    start=$(ms_now)
    "$cosy" "${common[@]}" say "${flag[@]}" ${say_flags[@]+"${say_flags[@]}"} --voice me --seed 1 --event-log "$out/$path$r.log" "$text"
    end=$(ms_now)
    printf '%-6s %-5s %16s %12s\n' "$r" "$path" "$(first_audio "$out/$path$r.log")" "$((end - start))"
  done
done

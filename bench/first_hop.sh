#!/usr/bin/env bash
# A shorter first streaming hop against the official schedule (issue 29, point 5): for each first hop
# (streaming.token_hop_len; the official value is the model's, 25 tokens, growing 25, 50, 100, 100...),
# the time to first audio (cosy profile --stream, MIN_TOKENS forced speech tokens, median of RUNS) and
# the fidelity of the streamed audio to the same tokens said offline (bench/hop_fidelity.py: SNR and
# log-spectrum distance; the official hop's own distance is the baseline: streaming is never
# bit-equal to offline, since each chunk's DiT sees less of the future).
#
#   HOPS="25 15 10" bench/first_hop.sh MODEL_DIR [-- extra cosy flags, e.g. --provider cuda --precision fp16]
#
# Needs target/release/cosy (or BIN_DIR), and a python with numpy (PYTHON, default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1; shift
[ "${1:-}" = "--" ] && shift
bin=${BIN_DIR:-target/release}; py=${PYTHON:-python3}
hops=${HOPS:-25 15 10}; runs=${RUNS:-3}; tokens=${MIN_TOKENS:-100}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
text="The old lighthouse blinked twice before the fog rolled in over the quiet harbour town, and the boats came home one by one."
prompt=(--prompt-wav tests/fixtures/prompt_24k.wav --prompt-text "This recording is the voice prompt.")
"$bin/cosy" --model "$model" "$@" file "$text" "${prompt[@]}" --seed 7 --no-stream --format wavf32 -o "$work/offline.wav" --dump "$work/dump-offline" >/dev/null
echo "| first hop (tokens) | hops | first audio ms (median of $runs, $tokens tokens) | SNR vs offline dB | log-spectrum distance vs offline dB |"
echo "|---|---|---|---|---|"
for hop in $hops; do
  max=$(( hop > 100 ? hop : 100 ))
  set_hop=(--set streaming.token_hop_len="$hop" --set streaming.token_max_hop_len="$max")
  "$bin/cosy" --model "$model" "$@" "${set_hop[@]}" file "$text" "${prompt[@]}" --seed 7 --stream --format wavf32 \
    -o "$work/hop-$hop.wav" --dump "$work/dump-$hop" >/dev/null
  "$bin/cosy" --model "$model" "$@" "${set_hop[@]}" profile "$text" "${prompt[@]}" --stream --min-tokens "$tokens" \
    --runs "$runs" --warmup 1 --json "$work/profile-$hop.json" >/dev/null
  "$py" bench/hop_fidelity.py "$work/offline.wav" "$work/hop-$hop.wav" "$work/profile-$hop.json" \
    "$work/dump-offline/speech_token.npy" "$work/dump-$hop/speech_token.npy" "$hop"
done

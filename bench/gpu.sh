#!/usr/bin/env bash
# The GPU checks of a lent device machine, in one call (issue 29; docs/benchmarks.md, "On a GPU").
# Every row of the issue's acceptance table, before and after side by side in one run:
#   before = today's GPU path  (BEFORE_SET: the growing KV cache, no shape buckets)
#   after  = the fixed-shape path (AFTER_SET: the static KV cache written in place, shape buckets;
#            CUDA graphs for the LLM step are not built yet)
# For each: offline RTF and the LLM's decode ms/token (cosy profile, 100 tokens), streaming first
# audio (cosy profile --stream), and the engine at load (examples/concurrency: the LLM alone at
# c = 1 and 16, streaming at c = 1 and 16, offline at c = 64). Then the audio's NaN/Inf check (fp16),
# the golden cases on CUDA fp32 against the official intermediates (GOLDEN_MODEL, tokens and audio
# through compare.py), `cosy say` cold against warm (bench/say_warm.sh, issue 34), the
# TensorRT-for-RTX refusal line on this GPU, and ONNX Runtime's profile of
# the decode steps (kernels, host gap: bench/ort_profile.py). The table (bench/gpu_table.py) goes to
# the log and to OUT_DIR/table.md.
#
# Each step has its own time limit inside BUDGET seconds, so a slow step costs its own results only.
# OUT_DIR ends with at most 8 files (the device tool brings back no more): log.txt, table.md,
# table.json and results.tar.gz (everything else). ONLY=REGEX runs only the steps whose names match.
#
#   COSY_ORT_LIBRARY=/root/ortgpu/lib/libonnxruntime.so BUDGET=480 bench/gpu.sh MODEL_DIR OUT_DIR
#
# Needs the release binaries in target/release (cosy, examples/concurrency; no cargo there), and
# python3 with numpy (bench/finite_wav.py, compare.py). GOLDEN_MODEL: the tiny reference model
# exported by `python -m cosy_export export ../shared/reference/tiny-official DIR --precisions fp32`
# (made here and carried), REFERENCE: the reference folder (its golden/ and compare.py).
# GOLDEN_VENV: a venv whose bin/python has numpy (default /usr: the system python3).
# PROVIDER=cpu PRECISION=fp32 BIN_DIR=target/debug let the script itself be tried without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
model=$1; out=$2; budget=${BUDGET:-480}
mkdir -p "$out/files"
exec > >(tee "$out/log.txt") 2>&1
gpu=${PROVIDER:-cuda}; precision=${PRECISION:-fp16}
before_set=${BEFORE_SET:-"--set engine.llm_kv=growing --set runtime.shape_buckets=off"}
after_set=${AFTER_SET:-"--set engine.llm_kv=static --set runtime.shape_buckets=on"}
bin=${BIN_DIR:-target/release}  # target/debug lets the script be tried without a release build
cosy=$bin/cosy
conc=$bin/examples/concurrency
files="$out/files"
start=$SECONDS
text="The old lighthouse blinked twice before the fog rolled in over the quiet harbour town."
prompt=(--prompt-wav tests/fixtures/prompt_24k.wav --prompt-text "This recording is the voice prompt.")

step() { # NAME LIMIT_SECONDS CMD...: runs CMD with at most LIMIT seconds and what is left of BUDGET
  local name=$1 limit=$2 t0=$SECONDS left rc; shift 2
  if [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]]; then echo "== $name: not in ONLY"; return; fi
  left=$(( budget - (SECONDS - start) ))
  (( limit > left )) && limit=$left
  if (( limit < 15 )); then echo "== $name: skipped, ${left}s of the budget left"; return; fi
  echo "== $name (limit ${limit}s, at $((SECONDS - start))s)"
  timeout -k 5 "$limit" "$@"; rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0))s"
}

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv,noheader \
  | tee "$files/gpu.txt"
"$cosy" --version

measure() { # LABEL: the rows of one setting
  local label=$1 set_args cell
  [ $label = after ] && set_args=($after_set) || set_args=($before_set)
  base=(--model "$model" --provider "$gpu" --precision "$precision" "${set_args[@]}")
  step "$label: offline profile" 60 "$cosy" "${base[@]}" profile "$text" "${prompt[@]}" --min-tokens 100 --runs 3 \
    --warmup 1 --json "$files/profile-$label-offline.json"
  step "$label: streaming profile" 60 "$cosy" "${base[@]}" profile "$text" "${prompt[@]}" --stream --min-tokens 100 \
    --runs 3 --warmup 1 --json "$files/profile-$label-stream.json"
  # Optional, not the default (issue 29, point 5): a 15-token first hop, as the Triton runtime starts.
  step "$label: streaming profile, first hop 15" 60 "$cosy" "${base[@]}" --set streaming.token_hop_len=15 profile "$text" \
    "${prompt[@]}" --stream --min-tokens 100 --runs 3 --warmup 1 --json "$files/profile-$label-stream-hop15.json"
  : > "$files/conc-$label.jsonl"
  for cell in "llm 1" "llm 16" "streaming 1" "streaming 16" "offline 64"; do
    set -- $cell
    step "$label: engine $1 c=$2" 60 bash -c '"$0" "$@" >> "'"$files/conc-$label.jsonl"'"' "$conc" --model "$model" \
      --concurrency "$2" --tokens 100 --mode "$1" --set runtime.providers="$gpu" --set runtime.precision="$precision" "${set_args[@]}"
  done
  step "$label: file (wavf32)" 40 "$cosy" "${base[@]}" file "$text" "${prompt[@]}" --format wavf32 -o "$files/$label.wav"
  step "$label: NaN/Inf check" 20 bash -c 'python3 bench/finite_wav.py "$0" | tee "$1"' "$files/$label.wav" "$files/finite-$label.txt"
}

measure after

# ONNX Runtime's own profile of the LLM's decode steps on the new path (one request, 100 tokens).
rm -rf /tmp/cosy-ort-profile && mkdir -p /tmp/cosy-ort-profile
step "after: ORT profile of the decode steps" 60 "$conc" --model "$model" --concurrency 1 --tokens 100 --mode llm \
  --set runtime.providers="$gpu" --set runtime.precision="$precision" $after_set --set runtime.ort_profile=/tmp/cosy-ort-profile/p
for stage in llm_step llm; do
  if ls /tmp/cosy-ort-profile/p-"$stage"_*.json >/dev/null 2>&1; then
    python3 bench/ort_profile.py --stage "$stage" /tmp/cosy-ort-profile/p --json "$files/ort-decode.json" | tee "$files/ort-decode.txt"
    break
  fi
done

# The golden cases on CUDA fp32: the official tokens and audio within compare.py's bounds.
if [ -n "${GOLDEN_MODEL:-}" ] && [ -n "${REFERENCE:-}" ]; then
  step "golden cases, $gpu fp32" 90 bash -c 'COSY_BIN="$0" COSY_EXPORTED="$1" COSY_SHARED="$2" COSY_PROVIDER="$3" \
    COSY_VENV="${GOLDEN_VENV:-/usr}" scripts/golden.sh > "$4" 2>&1; rc=$?; tail -n 30 "$4"; echo "golden exit $rc" >> "$4"; exit $rc' \
    "$cosy" "$GOLDEN_MODEL" "$(dirname "$REFERENCE")" "$gpu" "$files/golden-$gpu.txt"
else
  echo "== golden cases: GOLDEN_MODEL and REFERENCE not set" | tee "$files/golden-$gpu.txt"
fi

# Issue 34's last point: first audio of `cosy say` with a warm local server against a cold one,
# full size, on this GPU (the CPU here cannot show it: synthesis, not the load, dominates there).
step "say: cold against warm (issue 34)" 120 bash -c 'PROVIDER="$0" PRECISION="$1" COSY_BIN="$2" bash bench/say_warm.sh "$3" 2 \
  > "$4" 2>&1; rc=$?; cat "$4"; exit $rc' "$gpu" "$precision" "$cosy" "$model" "$files/say-warm.txt"

# TensorRT for RTX on this GPU: asked for alone (refused: one line, exit 2, nothing written), then
# with fallback to CUDA (the fallback taken).
step "tensorrt-rtx alone" 40 bash -c '"$0" --model "$1" --provider tensorrt-rtx --precision fp16 file "$2" -o /tmp/trt-rtx.wav \
  > "$3" 2>&1; echo "exit $? file $(test -e /tmp/trt-rtx.wav && echo written || echo absent)" >> "$3"; cat "$3"' \
  "$cosy" "$model" "$text" "$files/trt-rtx.txt"
step "tensorrt-rtx,$gpu with fallback" 60 bash -c '"$0" --model "$1" --provider "tensorrt-rtx,$4" --set runtime.allow_fallback=true --precision fp16 \
  file "$2" -o /tmp/trt-rtx-fallback.wav > "$3" 2>&1; echo "exit $?" >> "$3"; tail -n 5 "$3"' \
  "$cosy" "$model" "$text" "$files/trt-rtx-fallback.txt" "$gpu"

# Today's path last: the new path's rows and the checks above come first if the budget runs short.
measure before

python3 bench/gpu_table.py "$files" --md "$out/table.md" --json "$out/table.json"
rm -f "$files"/*.wav
tar -czf "$out/results.tar.gz" -C "$out" files && rm -rf "$files"
echo "== done at $((SECONDS - start))s"

#!/usr/bin/env bash
# The GPU checks of a lent device machine, in one call (docs/benchmarks.md, "On a GPU"): the CUDA
# provider end to end on the full-size random model (fp32 and fp16, audio checked for NaN/Inf),
# `cosy profile --matrix`, then the concurrency and server load benchmarks. Each step has its own
# time limit inside BUDGET seconds, so a slow step costs its own results only; everything is written
# to OUT_DIR (at most 8 files: the device tool brings back no more). ONLY=REGEX runs only the steps
# whose names match.
#
#   COSY_ORT_LIBRARY=/root/ortgpu/lib/libonnxruntime.so BUDGET=480 bench/gpu.sh MODEL_DIR OUT_DIR
#
# Needs the release binaries in target/release (cosy, examples/concurrency, examples/serve_load;
# no cargo there), curl, and python3 with numpy (bench/finite_wav.py).
set -uo pipefail
cd "$(dirname "$0")/.."
model=$1; out=$2; budget=${BUDGET:-480}
# PROVIDER=cpu and SETTINGS=cpu:fp32 let the script itself be tried on a machine without a GPU.
gpu=${PROVIDER:-cuda}; settings=${SETTINGS:-cpu:fp32,cuda:fp32,cuda:fp16,tensorrt:fp16}
cosy=target/release/cosy
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

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$cosy" --version
for p in fp32 fp16; do
  step "$gpu $p profile (offline, 100 tokens)" 100 "$cosy" --model "$model" --provider "$gpu" --precision "$p" \
    profile "$text" "${prompt[@]}" --min-tokens 100 --runs 3 --warmup 1 --json "$out/profile-$gpu-$p.json"
  step "$gpu $p file (wavf32)" 60 "$cosy" --model "$model" --provider "$gpu" --precision "$p" file "$text" "${prompt[@]}" \
    --format wavf32 -o "/tmp/gpu-$p.wav"
  step "$gpu $p NaN/Inf check" 20 python3 bench/finite_wav.py "/tmp/gpu-$p.wav"
done
step "$gpu fp16 profile (streaming, 100 tokens)" 80 "$cosy" --model "$model" --provider "$gpu" --precision fp16 \
  profile "$text" "${prompt[@]}" --stream --min-tokens 100 --runs 3 --warmup 1 --json "$out/profile-$gpu-fp16-stream.json"
# The same without the DiT's prompt-prefix cache (engine.prompt_cache_bytes = 0), side by side: the
# warm-up run above recorded the voice's cache, so the measured runs above used it.
step "$gpu fp16 profile (streaming, 100 tokens, no prompt cache)" 80 "$cosy" --model "$model" --provider "$gpu" \
  --precision fp16 --set engine.prompt_cache_bytes=0 profile "$text" "${prompt[@]}" --stream --min-tokens 100 --runs 3 \
  --warmup 1 --json "$out/profile-$gpu-fp16-stream-nocache.json"
# The same with ONNX Runtime's own cuDNN setting, side by side (runtime.cuda_conv_search).
step "$gpu fp16 profile (streaming, 100 tokens, exhaustive conv search)" 80 "$cosy" --model "$model" --provider "$gpu" \
  --precision fp16 --set runtime.cuda_conv_search=exhaustive profile "$text" "${prompt[@]}" --stream --min-tokens 100 \
  --runs 3 --warmup 1 --json "$out/profile-$gpu-fp16-stream-exhaustive.json"
step "profile --matrix" 200 bash -c '"$0" --model "$1" profile "$2" --prompt-wav tests/fixtures/prompt_24k.wav \
  --prompt-text "This recording is the voice prompt." --matrix --settings "$4" \
  --min-tokens 100 --runs 2 --warmup 1 2>&1 | tee "$3/matrix.txt"' "$cosy" "$model" "$text" "$out" "$settings"
step "concurrency ($gpu fp16)" 160 env BENCH_PREBUILT=1 LEVELS="${LEVELS:-1 4 16}" MODES="offline streaming" TOKENS=100 \
  bench/concurrency.sh "$model" "$out/concurrency.jsonl" -- --set runtime.providers=$gpu --set runtime.precision=fp16
step "serve load ($gpu fp16)" 150 env BENCH_PREBUILT=1 LEVELS="${LEVELS:-1 4 16}" REQUESTS=8 MIN_TOKENS=100 \
  bench/serve_load.sh "$model" "$out/serve-load.jsonl" -- --set runtime.providers=$gpu --set runtime.precision=fp16
echo "== done at $((SECONDS - start))s"

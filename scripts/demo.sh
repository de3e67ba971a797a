#!/usr/bin/env bash
# Sets up and runs the main job: synthesise a sentence to out/demo.wav with the model configured
# in config.toml (model.dir), or with the bundled tiny random-weight model when none is there
# (random weights: the WAV is noise, not speech).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
cosy=target/release/cosy
model_args=()
if ! $cosy doctor --quick >/dev/null 2>&1; then
  echo "demo: no usable model configured (config.toml model.dir); using the bundled tiny random-weight model"
  model_args=(--model tests/fixtures/tiny)
fi
mkdir -p out
$cosy "${model_args[@]}" file "Hello from cosy. This is a streaming text to speech runtime." \
  --prompt-wav tests/fixtures/prompt_24k.wav \
  --prompt-text "This recording is the voice prompt." \
  -o out/demo.wav
echo "demo: wrote out/demo.wav"

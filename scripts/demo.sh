#!/usr/bin/env bash
# Sets up and runs the main job: synthesise a sentence to out/demo.wav with the model configured
# in config.toml (model.dir), or with the bundled tiny random-weight model when none is there
# (random weights: the WAV is noise, not speech). It ends with a default voice, so that the next
# command can be just `target/release/cosy say "Hello"`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh
cosy=target/release/cosy
model_args=()
if ! $cosy doctor --quick >/dev/null 2>&1; then
  if [ ! -e models/cosyvoice3 ] && [ -z "${COSY_MODEL:-}" ]; then
    # The configured default folder is free: install the bundled model there, so that plain
    # `cosy say` finds it. `scripts/export.sh SRC models/cosyvoice3` replaces it with a real one.
    echo "demo: no model at models/cosyvoice3; installing the bundled tiny random-weight model there (noise, not speech)"
    mkdir -p models
    cp -r tests/fixtures/tiny models/cosyvoice3.partial && mv models/cosyvoice3.partial models/cosyvoice3
  fi
  if ! $cosy doctor --quick >/dev/null 2>&1; then
    echo "demo: the configured model folder is not usable (see \`$cosy doctor\`); using the bundled tiny random-weight model"
    model_args=(--model tests/fixtures/tiny)
  fi
fi
prompt=tests/fixtures/prompt_24k.wav
transcript="This recording is the voice prompt."
mkdir -p out
$cosy "${model_args[@]}" file "Hello from cosy. This is a streaming text to speech runtime." \
  --prompt-wav "$prompt" --prompt-text "$transcript" -o out/demo.wav
echo "demo: wrote out/demo.wav"
# A saved voice from the bundled prompt, made the default unless the user already has one.
if $cosy "${model_args[@]}" voice default | grep -q '^no default voice'; then
  $cosy "${model_args[@]}" voice add demo --wav "$prompt" --text "$transcript" --force --default
  echo "demo: next, try: $cosy ${model_args[*]} say \"Hello\""
fi

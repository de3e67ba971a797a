#!/usr/bin/env bash
# Sets up what the tests need (system packages, ONNX Runtime, the exporter's venv, the clients; each skipped
# when already there) and runs every test: Rust (unit + integration, incl. the golden comparison
# against the official intermediates), then the exporter's pytest suite.
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
scripts/setup.sh --python --no-build
export COSY_VENV="${COSY_VENV:-$HOME/.cache/cosy/venv}"

# The library without the command-line front end (no clap, cpal, indicatif, ctrlc) must build:
# that is what a server or another program embeds.
cargo check --quiet --lib --no-default-features
cargo test --all-targets "$@"

# The real clients against `cosy serve` (the openai Python and Node SDKs, ffmpeg, Chromium), in
# their own small venv.
"${COSY_CLIENTS_TEST_VENV:-$HOME/.cache/cosy/client-tests-venv}/bin/python" -m pytest -q tests/clients/python

cd onnx
"$COSY_VENV/bin/python" -m pytest -q

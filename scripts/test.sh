#!/usr/bin/env bash
# Sets up what the tests need (system packages, ONNX Runtime, the exporter's venv, the clients; each skipped
# when already there) and runs every test: Rust (unit + integration, incl. the golden comparison
# against the official intermediates), then the exporter's pytest suite.
# Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
# --trt-rtx: the TensorRT for RTX plugin (downloaded once into ~/.cache/cosy/wheels): the tests load
# the real plugin and check its refusal and fallback on a machine without a GPU.
scripts/setup.sh --python --trt-rtx --no-build
export COSY_VENV="${COSY_VENV:-$HOME/.cache/cosy/venv}"

# The library without the binary's crates must build: that is what another program embeds. Its
# dependency tree has no front end's crate (docs/architecture.md, "The library and the binary").
cargo check --quiet --lib --no-default-features
if front=$(cargo tree --quiet --no-default-features -e normal --prefix none | grep -E '^(clap|clap_complete|clap_mangen|axum|hyper|hyper-util|tower-http|tokio|cpal|ctrlc|indicatif) ' | sort -u) && [ -n "$front" ]; then
  echo "test.sh: the library depends on a front end's crate:" >&2; echo "$front" >&2; exit 1
fi
cargo test --all-targets "$@"

# The embedding example synthesises through the library alone.
embed_out="$(mktemp -d)"
cargo run --quiet --example embed -- tests/fixtures/tiny tests/fixtures/prompt_24k.wav \
  "This recording is the voice prompt." "The library alone speaks." "$embed_out/embed.wav"
test -s "$embed_out/embed.wav"
rm -rf "$embed_out"

# The real clients against `cosy serve` (the openai Python and Node SDKs, ffmpeg, Chromium), in
# their own small venv; with them the soak's 2-minute version (test_soak.py runs bench/soak.py).
"${COSY_CLIENTS_TEST_VENV:-$HOME/.cache/cosy/client-tests-venv}/bin/python" -m pytest -q tests/clients/python

# The Python package (`import cosy`): its wheel, installed in a fresh venv, against the binary.
scripts/test-python.sh

cd onnx
"$COSY_VENV/bin/python" -m pytest -q

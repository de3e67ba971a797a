#!/usr/bin/env bash
# Builds the Python package's wheel (`import cosy`, distribution cosy-tts; docs/python.md) into
# dist/: an abi3 wheel (CPython 3.9 and newer) of the PyO3 extension in python/, built by maturin
# in release mode. The wheel is tagged manylinux for the oldest glibc whose symbols it uses
# (maturin's own auditwheel check; it links nothing but glibc and libgcc), so it installs on
# that glibc and newer. ONNX Runtime is not inside: it comes from the onnxruntime package.
#   scripts/wheel.sh            -> dist/cosy_tts-<version>-cp39-abi3-manylinux_*.whl
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
MATURIN_VERSION=1.16.0
venv="${COSY_WHEEL_VENV:-$HOME/.cache/cosy/wheel-venv}"
if [ ! -x "$venv/bin/maturin" ] || ! "$venv/bin/maturin" --version | grep -q " $MATURIN_VERSION\$"; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "maturin==$MATURIN_VERSION"
fi
mkdir -p dist
rm -f dist/cosy_tts-*.whl
"$venv/bin/maturin" build --quiet --release --manifest-path python/Cargo.toml --out dist "$@"
ls dist/cosy_tts-*.whl

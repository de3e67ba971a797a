#!/usr/bin/env bash
# The test suite: Rust (unit + integration, dev profile with optimised dependencies), then the
# exporter's Python tests. Needs .ort/libonnxruntime.so (scripts/setup-ort.sh) and the venv at
# $COSY_VENV (default ~/.cache/cosy/venv). Extra arguments go to `cargo test`.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
VENV="${COSY_VENV:-$HOME/.cache/cosy/venv}"

cargo test --all-targets "$@"

cd onnx
set +e
"$VENV/bin/python" -m pytest -q
rc=$?
set -e
# pytest exits 5 when it collected no tests (the exporter may not have any yet): not a failure.
if [ "$rc" -eq 5 ]; then
  echo "pytest: no tests collected"
  rc=0
fi
exit "$rc"

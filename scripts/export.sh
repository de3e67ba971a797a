#!/usr/bin/env bash
# Export an official CosyVoice3 checkpoint folder into a cosy model folder.
#   scripts/export.sh SRC DST [--precisions fp32,fp16] [--noise-frames N]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ $# -lt 2 ]; then echo "usage: scripts/export.sh SRC DST [exporter options]" >&2; exit 2; fi
src="$(realpath "$1")"; dst="$(realpath -m "$2")"; shift 2
"$root/scripts/setup.sh" --python --no-build
venv="${COSY_VENV:-$HOME/.cache/cosy/venv}"
cd "$root/onnx"
exec "$venv/bin/python" -m cosy_export export "$src" "$dst" "$@"

#!/usr/bin/env bash
# Puts libonnxruntime.so (1.31.x, from the PyPI wheel) into .ort/ (git-ignored).
#   scripts/setup-ort.sh          CPU build (package onnxruntime)
#   scripts/setup-ort.sh --gpu    CUDA + TensorRT providers (package onnxruntime-gpu, CUDA 13)
# cosy finds the library through config (runtime.ort_library), $ORT_DYLIB_PATH, beside its executable
# (<prefix>/lib/cosy/, as scripts/install.sh puts it), or a checkout's .ort/libonnxruntime.so (src/runtime/env.rs).
set -euo pipefail
ORT_VERSION="${ORT_VERSION:-1.31.1}"
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.ort"
pkg=onnxruntime
[ "${1:-}" = "--gpu" ] && pkg=onnxruntime-gpu
if [ -e "$dest/libonnxruntime.so" ] && [ -f "$dest/PACKAGE" ] && [ "$(cat "$dest/PACKAGE")" = "$pkg==$ORT_VERSION" ]; then
  echo "onnxruntime: $dest/libonnxruntime.so ($pkg $ORT_VERSION) already present"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
py="$(command -v python3)"
"$py" -m pip download -q --no-deps --only-binary=:all: \
  --python-version 3.11 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  -d "$tmp" "$pkg==$ORT_VERSION"
whl="$(ls "$tmp"/*.whl | head -n1)"
mkdir -p "$dest"
rm -f "$dest"/libonnxruntime*.so*
(cd "$tmp" && "$py" -m zipfile -e "$whl" unpacked >/dev/null)
cp "$tmp"/unpacked/onnxruntime/capi/libonnxruntime*.so* "$dest/"
lib="$(ls "$dest"/libonnxruntime.so.* | head -n1)"
ln -sf "$(basename "$lib")" "$dest/libonnxruntime.so"
echo "$pkg==$ORT_VERSION" > "$dest/PACKAGE"
echo "onnxruntime: installed $pkg $ORT_VERSION -> $dest/libonnxruntime.so"

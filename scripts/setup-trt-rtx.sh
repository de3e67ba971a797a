#!/usr/bin/env bash
# Puts the TensorRT for RTX execution provider plugin (PyPI onnxruntime-ep-nv-tensorrt-rtx-cu12) beside
# ONNX Runtime in .ort/ (git-ignored): the plugin library, TensorRT for RTX, its ONNX parser and the CUDA
# runtime it bundles, with the versioned links the wheel's Python helper makes on import
# (libtensorrt_rtx.so.1 and libtensorrt_rtx.so -> libtensorrt_rtx.so.1.7.1, the same for the parser, and
# libcudart.so.12 -> libcudart.so.12.9.79, which the plugin needs by that name).
#   scripts/setup-trt-rtx.sh     (scripts/setup.sh --gpu runs it; scripts/test.sh too, for the tests that
#                                 load the real plugin on a machine without a GPU)
# The wheel (~170 MB) is downloaded once into ${COSY_WHEEL_CACHE:-~/.cache/cosy/wheels}; a second run with the
# same version installed does nothing. cosy finds the plugin beside the loaded libonnxruntime.so, or where
# runtime.tensorrt_rtx_library / COSY_TENSORRT_RTX_LIBRARY says (src/runtime/providers.rs).
set -euo pipefail
TRT_RTX_EP_VERSION="${TRT_RTX_EP_VERSION:-0.5.0}"
pkg=onnxruntime-ep-nv-tensorrt-rtx-cu12
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$root/.ort"
stamp="$dest/PACKAGE-TENSORRT-RTX"
plugin=libonnxruntime_providers_nv_tensorrt_rtx.so
if [ -f "$dest/$plugin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pkg==$TRT_RTX_EP_VERSION" ]; then
  echo "tensorrt-rtx: $dest/$plugin ($pkg $TRT_RTX_EP_VERSION) already present"
  exit 0
fi
if [ ! -e "$dest/libonnxruntime.so" ]; then
  echo "setup-trt-rtx.sh: no ONNX Runtime in $dest; run scripts/setup-ort.sh first" >&2
  exit 1
fi
cache="${COSY_WHEEL_CACHE:-$HOME/.cache/cosy/wheels}"
mkdir -p "$cache"
py="$(command -v python3)"
whl="$(ls "$cache"/onnxruntime_ep_nv_tensorrt_rtx_cu12-"$TRT_RTX_EP_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [ -z "$whl" ]; then
  echo "tensorrt-rtx: downloading $pkg $TRT_RTX_EP_VERSION (~170 MB) into $cache"
  "$py" -m pip download -q --no-deps --only-binary=:all: \
    --python-version 3.11 --implementation cp \
    --platform manylinux_2_28_x86_64 \
    -d "$cache" "$pkg==$TRT_RTX_EP_VERSION"
  whl="$(ls "$cache"/onnxruntime_ep_nv_tensorrt_rtx_cu12-"$TRT_RTX_EP_VERSION"-*.whl | head -n1)"
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && "$py" -m zipfile -e "$whl" unpacked >/dev/null)
src="$tmp/unpacked/onnxruntime_ep_nv_tensorrt_rtx"
# An earlier version's files (other version numbers) must not be picked up by the links below.
rm -f "$dest/$plugin" "$dest"/libtensorrt_rtx.so* "$dest"/libtensorrt_onnxparser_rtx.so* "$dest"/libcudart.so.12* \
  "$dest"/libtensorrt_plugins.so "$dest"/libtensorrt_shim.so "$stamp"
cp "$src"/*.so "$src"/*.so.* "$dest/"
# The versioned links: SONAME (what NEEDED entries ask for) and the bare name (TensorRT for RTX
# dlopens "libtensorrt_rtx.so" itself when a session is made).
link() { # base: the newest real file base.so.X.Y.Z gets base.so.X and base.so
  local base="$1" real soname
  real="$(cd "$dest" && ls "$base".so.*.* 2>/dev/null | sort -V | tail -n1)"
  [ -n "$real" ] || { echo "setup-trt-rtx.sh: $base.so.* missing from the wheel" >&2; exit 1; }
  soname="$base.so.$(echo "${real#"$base".so.}" | cut -d. -f1)"
  ln -sf "$real" "$dest/$soname"
  ln -sf "$real" "$dest/$base.so"
}
link libtensorrt_rtx
link libtensorrt_onnxparser_rtx
cudart="$(cd "$dest" && ls libcudart.so.12.* | sort -V | tail -n1)"
ln -sf "$cudart" "$dest/libcudart.so.12"
echo "$pkg==$TRT_RTX_EP_VERSION" > "$stamp"
echo "tensorrt-rtx: installed $pkg $TRT_RTX_EP_VERSION -> $dest/$plugin"

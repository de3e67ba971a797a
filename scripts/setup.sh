#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian/Ubuntu machine with a Rust toolchain and Python 3.11.
#   scripts/setup.sh            system packages, ONNX Runtime (.ort/), release build of cosy
#   scripts/setup.sh --python   also the exporter's venv (torch etc.) at ${COSY_VENV:-~/.cache/cosy/venv}
#                               and the real clients the tests drive (ffmpeg, chromium, the openai Python
#                               SDK in its own small venv, the openai Node SDK)
#   scripts/setup.sh --gpu      ONNX Runtime with the CUDA + TensorRT providers instead of the CPU build, and
#                               the TensorRT for RTX plugin beside it (scripts/setup-trt-rtx.sh; docs/gpu.md)
#   scripts/setup.sh --trt-rtx  only the TensorRT for RTX plugin beside the CPU build (what the tests load)
# Each step is skipped when already done, so the other scripts call this first.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
want_python=0; want_build=1; want_trt_rtx=0; ort_args=()
for a in "$@"; do
  case "$a" in
    --python) want_python=1 ;;
    --no-build) want_build=0 ;;
    --gpu) ort_args+=(--gpu); want_trt_rtx=1 ;;
    --trt-rtx) want_trt_rtx=1 ;;
    *) echo "setup.sh: unknown option $a (use --python, --gpu, --trt-rtx, --no-build)" >&2; exit 2 ;;
  esac
done

# cpal (audio output) links ALSA; pkg-config finds it. make: the server's mp3 encoder (LAME,
# bundled in mp3lame-sys) builds with its own configure script. ffmpeg: the server tests decode
# every response format with it (tests/serve/formats.rs).
# speech-dispatcher: the screen reader's speech server, which the tests start with cosy's module
# (tests/cli/speechd.rs).
if ! dpkg -s pkg-config libasound2-dev make ffmpeg speech-dispatcher >/dev/null 2>&1; then
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  $sudo_cmd apt-get install -y -q pkg-config libasound2-dev make ffmpeg speech-dispatcher
fi

scripts/setup-ort.sh "${ort_args[@]}"
# After ONNX Runtime: the plugin goes into the same folder (setup-ort.sh replaces libonnxruntime*
# files there, the plugin's among them, so this re-checks it every time).
if [ "$want_trt_rtx" = 1 ]; then
  scripts/setup-trt-rtx.sh
fi

if [ "$want_python" = 1 ]; then
  venv="${COSY_VENV:-$HOME/.cache/cosy/venv}"
  stamp="$venv/.cosy-requirements.sha256"
  want="$(sha256sum onnx/requirements.txt | cut -d' ' -f1)"
  if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing the exporter's Python environment into $venv (torch is ~3 GB)"
    python3 -m venv "$venv"
    # --no-cache-dir: the ~3 GB of wheels are installed once; a second copy in pip's cache only
    # costs disk (CI machines can be short of it).
    "$venv/bin/python" -m pip install -q --no-cache-dir --upgrade pip
    "$venv/bin/python" -m pip install -q --no-cache-dir -r onnx/requirements.txt
    echo "$want" > "$stamp"
  fi
fi

if [ "$want_python" = 1 ]; then
  # The real clients of the Python server tests (ffmpeg is above): headless Chromium loads pages
  # and checks CORS, the official openai Node SDK (pinned in tests/clients/node).
  missing=()
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
  if [ ${#missing[@]} -gt 0 ]; then
    sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -q
    $sudo_cmd apt-get install -y -q "${missing[@]}"
  fi
  # The Python clients (the openai SDK) in a small venv of their own, not the exporter's.
  scripts/python-venv.sh "${COSY_CLIENTS_TEST_VENV:-$HOME/.cache/cosy/client-tests-venv}" tests/clients/requirements.txt
  node_dir=tests/clients/node
  want="$(sha256sum "$node_dir/package-lock.json" | cut -d' ' -f1)"
  if [ "$(cat "$node_dir/node_modules/.cosy-lock.sha256" 2>/dev/null)" != "$want" ]; then
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$want" > "$node_dir/node_modules/.cosy-lock.sha256"
  fi
fi

if [ "$want_build" = 1 ]; then
  cargo build --release --quiet
fi

#!/usr/bin/env bash
# Prepares everything bench/gpu-device.sh needs on a lent GPU machine (issue 29), on this machine:
#   .gpu/bin.tar.xz      stripped release `cosy` and `examples/concurrency` (about 11 MB)
#   .gpu/golden.tar.xz   the tiny reference model exported (golden cases on CUDA fp32)
#   .ortgpu/part-NN      ONNX Runtime's GPU build in 40 MiB pieces (../shared/tools/ortgpu-for-device.sh)
# Both folders are kept out of git (.git/info/exclude). Then, with the device tool, one call per
# part (each call carries at most 64 MiB, the checkout's ~19 MiB included) and one last call
# (docs/benchmarks.md, "Issue 29: running the GPU checks"):
#   carry [".ortgpu/part-00"]: mkdir -p /root/ortgpu && cp .ortgpu/part-00 /root/ortgpu/   (each part)
#   carry [".gpu"]: OUT=$OUT BUDGET=420 bash bench/gpu-device.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .git ] || [ -f .git ] || { echo "gpu-prepare.sh: run it in a checkout" >&2; exit 2; }
exclude=$(git rev-parse --git-path info/exclude)
for d in /.gpu/ /.ortgpu/; do grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"; done
rm -rf .gpu && mkdir -p .gpu/stage/bin/examples
cargo build --release --quiet --bin cosy --example concurrency
strip -o .gpu/stage/bin/cosy target/release/cosy
strip -o .gpu/stage/bin/examples/concurrency target/release/examples/concurrency
tar -C .gpu/stage -cf - bin | xz -6 -T0 > .gpu/bin.tar.xz
venv=${COSY_VENV:-$HOME/.cache/cosy/venv}
shared=$(cd "${COSY_SHARED:-../shared}" && pwd)
(cd onnx && "$venv/bin/python" -m cosy_export export "$shared/reference/tiny-official" ../.gpu/stage/golden-model --precisions fp32) >/dev/null
mkdir -p .gpu/stage/reference && cp -r "$shared/reference/golden" "$shared/reference/compare.py" "$shared/reference/prompts" .gpu/stage/reference/
tar -C .gpu/stage -cf - golden-model reference | xz -6 -T0 > .gpu/golden.tar.xz
rm -rf .gpu/stage
if [ -z "${SKIP_ORT:-}" ]; then
  ls .ortgpu/part-* >/dev/null 2>&1 || "$shared/tools/ortgpu-for-device.sh"
  # A call carries at most 64 MiB with the checkout (about 19 MiB): pieces of 40 MiB, not 46.
  cat .ortgpu/part-* > .ortgpu/all && rm .ortgpu/part-* && split -b 40M -d .ortgpu/all .ortgpu/part- && rm .ortgpu/all
fi
ls -l .gpu .ortgpu 2>/dev/null

#!/usr/bin/env bash
# On the lent GPU machine (issue 29), after bench/gpu-prepare.sh here and the ONNX Runtime parts
# carried into /root/ortgpu (docs/benchmarks.md, "Running the GPU checks"): unpacks the binaries,
# the golden model and ONNX Runtime, makes the full-size random model (the host's python3 has
# torch, onnx and onnxscript), then runs bench/gpu.sh with what is left of BUDGET. Results in $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/gpu-out}; mkdir -p "$out"
t0=$SECONDS
[ -d target/release ] || { mkdir -p target/release && xz -dc .gpu/bin.tar.xz | tar -x --strip-components=1 -C target/release; }
mkdir -p /root/gpu && xz -dc .gpu/golden.tar.xz | tar -x -C /root/gpu
if [ ! -e /root/ortgpu/lib/libonnxruntime.so ]; then
  cp .ortgpu/part-* /root/ortgpu/ 2>/dev/null || true
  cat /root/ortgpu/part-* | xz -d | tar -x -C /root/ortgpu || { echo "gpu-device.sh: the ONNX Runtime parts are not all in /root/ortgpu" >&2; exit 2; }
fi
export COSY_ORT_LIBRARY=/root/ortgpu/lib/libonnxruntime.so
LD_LIBRARY_PATH=$(python3 -c 'import glob,site;print(":".join(glob.glob(site.getsitepackages()[0]+"/nvidia/*/lib")))'):${LD_LIBRARY_PATH:-}
export LD_LIBRARY_PATH
model=/root/gpu/full-export
if [ ! -e "$model/manifest.json" ]; then
  (cd onnx && python3 -m cosy_export random /root/gpu/full-random --size full \
    && python3 -m cosy_export export /root/gpu/full-random "$model" --precisions fp32,fp16 --no-text-normalization) \
    > "$out/export.log" 2>&1 || { tail -n 30 "$out/export.log"; exit 1; }
fi
echo "== unpacked and exported in $((SECONDS - t0))s"
BUDGET=${BUDGET:-480} GOLDEN_MODEL=/root/gpu/golden-model REFERENCE=/root/gpu/reference bash bench/gpu.sh "$model" "$out"

"""Manifest assembly: the contract the Rust runtime reads (docs/model-format.md).

Graph entries are read back from the written ONNX files themselves (names, dtypes, symbolic
shapes), so the manifest cannot drift from the graphs it describes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import onnx

FORMAT = "cosy-model"
FORMAT_VERSION = 1

_DTYPES = {
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
    onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.BOOL: "bool",
}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_entry(folder: Path, name: str) -> dict[str, Any]:
    path = folder / name
    return {"file": name, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def _value_info(v: onnx.ValueInfoProto) -> dict[str, Any]:
    t = v.type.tensor_type
    shape: list[int | str] = []
    for i, d in enumerate(t.shape.dim):
        if d.HasField("dim_value"):
            shape.append(int(d.dim_value))
        else:
            shape.append(d.dim_param or f"dim{i}")
    return {"name": v.name, "dtype": _DTYPES.get(t.elem_type, f"onnx:{t.elem_type}"), "shape": shape}


def graph_io(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Inputs and outputs of an ONNX file (initializers excluded), without loading weights."""
    model = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    inputs = [_value_info(v) for v in model.graph.input if v.name not in inits]
    outputs = [_value_info(v) for v in model.graph.output]
    return inputs, outputs


def variant_entry(folder: Path, name: str) -> dict[str, Any]:
    entry = file_entry(folder, name)
    data = folder / (name + ".data")
    entry["data"] = file_entry(folder, data.name) if data.exists() else None
    return entry


def graph_entry(
    folder: Path,
    variants: dict[str, str],
    trt_profile: dict[str, dict[str, list[int]]] | None = None,
    batching: str = "none",
) -> dict[str, Any]:
    """Manifest entry for one stage: I/O from the fp32 (or first) file, every variant hashed.

    `batching` says how requests share one call (docs/model-format.md): `none` (batch 1),
    `padded_kv` (llm: left-padded rows with attention_mask/position_ids), `kv_slots` (llm_step:
    rows in fixed cache slots written in place), `padded_frames`
    (dit: right-padded rows, per-row lengths through `mask`).

    Every variant must expose the same input/output names and dtypes; a mismatch is a bug in
    the exporter and is refused here rather than discovered by the runtime.
    """
    first = variants.get("fp32") or next(iter(variants.values()))
    inputs, outputs = graph_io(folder / first)
    for precision, name in variants.items():
        vi, vo = graph_io(folder / name)
        sig = lambda xs: [(x["name"], x["dtype"]) for x in xs]  # noqa: E731
        if sig(vi) != sig(inputs) or sig(vo) != sig(outputs):
            raise ValueError(f"{name} ({precision}) has different I/O from {first}")
    return {
        "inputs": inputs,
        "outputs": outputs,
        "variants": {p: variant_entry(folder, n) for p, n in variants.items()},
        "trt_profile": trt_profile or {},
        "batching": batching,
    }

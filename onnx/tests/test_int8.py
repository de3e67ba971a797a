"""int8 variants (--precisions ...,int8): made, described in the manifest, runnable, close to fp32.

Stated error on the tiny model (random weights, seed 0), same inputs into both variants:
mean |int8 - fp32| <= 5 % of mean |fp32| and max |int8 - fp32| <= 10 % of max |fp32|, for the LLM
logits and the DiT output (measured with 7-bit weights and per-row activation scales: LLM 2.0 % /
2.0 %, DiT 2.6 % / 3.2 %; one scale per tensor gave 2.5 % / 2.3 % and 2.7 % / 2.6 %; the integer
sums are exact on every x86-64 CPU, VNNI or not, see cosy_export/quant.py). The full-size
cost (greedy-token agreement, mel error) is measured in docs/benchmarks.md.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import dit_no_cache_feeds

from cosy_export.export import ExportError, ExportOptions, export_model
from cosy_export.manifest import sha256_file

MEAN_REL_TOL = 0.05
MAX_REL_TOL = 0.10


@pytest.fixture(scope="module")
def exported_int8(tiny_official: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export8") / "tiny"
    export_model(tiny_official, out, ExportOptions(precisions=["fp32", "int8"], text_normalization=False,
                                                   log=lambda _: None))
    return out


def _feeds(stage: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if stage == "llm":
        return {"inputs_embeds": rng.standard_normal((1, 5, 16)).astype(np.float32),
                "attention_mask": np.ones((1, 5), np.int64), "position_ids": np.arange(5, dtype=np.int64)[None],
                **{f"past_key_values.{i}.{kv}": np.zeros((1, 2, 0, 4), np.float32)
                   for i in range(2) for kv in ("key", "value")}}
    return {"x": rng.standard_normal((2, 80, 60)).astype(np.float32), "mask": np.ones((2, 1, 60), np.float32),
            "mu": rng.standard_normal((2, 80, 60)).astype(np.float32), "t": np.array([0.3, 0.3], np.float32),
            "spks": rng.standard_normal((2, 80)).astype(np.float32), "cond": np.zeros((2, 80, 60), np.float32),
            "block_frames": np.array([50], np.int64)}


def _ops(path: Path) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def test_manifest_lists_int8_for_llm_and_dit_only(exported_int8: Path) -> None:
    m = json.loads((exported_int8 / "manifest.json").read_text())
    for stage in ("llm", "dit"):
        v = m["graphs"][stage]["variants"]["int8"]
        assert v["file"] == f"{stage}.int8.onnx"
        assert sha256_file(exported_int8 / v["file"]) == v["sha256"]  # the file this export wrote
        # smaller than fp32: the projection weights are stored as int8
        assert v["bytes"] < m["graphs"][stage]["variants"]["fp32"]["bytes"]
    for stage in ("flow_front", "hift_decode", "campplus", "speech_tokenizer"):
        assert set(m["graphs"][stage]["variants"]) == {"fp32"}, stage


@pytest.mark.parametrize("stage", ["llm", "dit"])
def test_int8_quantises_only_weight_matmuls(exported_int8: Path, stage: str) -> None:
    fp32, int8 = _ops(exported_int8 / f"{stage}.fp32.onnx"), _ops(exported_int8 / f"{stage}.int8.onnx")
    assert int8["MatMulInteger"] > 0
    # Activations are quantised per row by our own ops (cosy_export/quant.py), not per tensor.
    assert int8["DynamicQuantizeLinear"] == 0
    # Normalisation, softmax and convolutions are untouched (still fp32 ops, same count).
    for op in ("LayerNormalization", "SimplifiedLayerNormalization", "Softmax", "Conv"):
        assert int8[op] == fp32[op], op
    # Activation x activation MatMuls (attention scores, ·V) stay fp32: MatMulConstBOnly.
    assert int8["MatMul"] > 0 or stage == "llm"
    assert int8["MatMul"] + int8["MatMulInteger"] == fp32["MatMul"] + fp32["Gemm"]


@pytest.mark.parametrize("stage", ["llm", "dit"])
def test_int8_output_is_close_to_fp32(exported_int8: Path, stage: str) -> None:
    feeds = _feeds(stage, np.random.default_rng(0))
    out = {}
    for p in ("fp32", "int8"):
        sess = ort.InferenceSession(str(exported_int8 / f"{stage}.{p}.onnx"), providers=["CPUExecutionProvider"])
        # fp32 I/O like every variant
        ints = ("block_frames", "record_frames", "attention_mask", "position_ids")
        assert all(i.type == "tensor(float)" for i in sess.get_inputs() if i.name not in ints)
        out[p] = sess.run(None, feeds | (dit_no_cache_feeds(sess, 2) if stage == "dit" else {}))[0]
    ref, q = out["fp32"], out["int8"]
    assert q.dtype == np.float32 and q.shape == ref.shape and np.isfinite(q).all()
    err = np.abs(q - ref)
    assert err.max() > 0, "int8 output identical to fp32: nothing was quantised"
    assert err.mean() <= MEAN_REL_TOL * np.abs(ref).mean(), (err.mean(), np.abs(ref).mean())
    assert err.max() <= MAX_REL_TOL * np.abs(ref).max(), (err.max(), np.abs(ref).max())
    if stage == "llm":
        # the greedy token survives on this input: int8's top logit leads its runner-up by 0.36 (fp32:
        # 0.54), and int8 outputs differ between CPUs only by float rounding (exact integer sums)
        assert (q.argmax(-1) == ref.argmax(-1)).all()


def test_int8_rows_do_not_depend_on_each_other(exported_int8: Path) -> None:
    """Per-row activation scales: an LLM row's logits are the same alone and batched beside a row
    of much larger activations (one scale per tensor would coarsen the small row's quantisation),
    and a DiT call's first 50-frame block is the same whatever frames follow it in a block-causal
    call (the blocks after it see it; it sees none of them).
    Within 1e-5 (float order of the fp32 ops around the exact integer sums)."""
    rng = np.random.default_rng(1)
    llm = ort.InferenceSession(str(exported_int8 / "llm.int8.onnx"), providers=["CPUExecutionProvider"])
    one = _feeds("llm", rng)
    two = {k: np.concatenate([v, v]) for k, v in one.items()}
    two["inputs_embeds"][1] *= 50.0
    alone, batched = llm.run(None, one)[0], llm.run(None, two)[0]
    assert float(np.abs(batched[0] - alone[0]).max()) <= 1e-5
    dit = ort.InferenceSession(str(exported_int8 / "dit.int8.onnx"), providers=["CPUExecutionProvider"])
    feeds = _feeds("dit", rng) | dit_no_cache_feeds(dit, 2)
    longer = {k: (np.concatenate([v, 30.0 * v], axis=2) if v.ndim == 3 else v) for k, v in feeds.items()}
    longer |= dit_no_cache_feeds(dit, 2)
    short, full = dit.run(None, feeds)[0], dit.run(None, longer)[0]
    assert float(np.abs(full[:, :, :50] - short[:, :, :50]).max()) <= 1e-5


def test_unknown_precision_is_refused(tiny_official: Path, tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="int4.*fp32, fp16, int8"):
        export_model(tiny_official, tmp_path / "out", ExportOptions(precisions=["fp32", "int4"], log=lambda _: None))
    assert not (tmp_path / "out").exists()

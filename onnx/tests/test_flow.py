"""Flow: golden mu/cond/mel with our own modules, streaming prefix invariance, ONNX parity, fp16 mixed."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from cosy_export.checkpoint import CheckpointError
from cosy_export.constants import exact_float32, rope_inverse_frequencies, time_frequencies
from cosy_export.flow import (
    CONV_POS_KERNEL,
    DIT_CACHE_INPUTS,
    DIT_INPUTS,
    DIT_OUTPUTS,
    CosyFlow,
    attention_allowed,
    cfm_solve,
    export_dit,
    export_flow_front,
    flow_inference,
    load_flow,
    make_dit_mixed_fp16,
)
from cosy_export.noise import flow_noise
from cosy_export.yamlcfg import load_model_config

CASES = ["en", "zh", "num", "p16k"]


@pytest.fixture(scope="module")
def flow(tiny_official: Path) -> CosyFlow:
    torch.set_num_threads(1)
    return load_flow(tiny_official)


@pytest.fixture(scope="module")
def noise() -> torch.Tensor:
    return flow_noise().unsqueeze(0)


def _load(golden: Path, case: str, name: str) -> torch.Tensor:
    return torch.from_numpy(np.load(golden / case / f"{name}.npy"))


@pytest.mark.parametrize("case", CASES)
def test_offline_matches_golden(flow: CosyFlow, noise: torch.Tensor, golden: Path, case: str) -> None:
    out = flow_inference(
        flow, noise, _load(golden, case, "speech_token"), _load(golden, case, "prompt_speech_token"),
        _load(golden, case, "prompt_feat"), _load(golden, case, "speaker_embedding"),
    )
    for key, tol in (("mu", 1e-3), ("cond", 5e-3), ("mel", 1e-3)):
        ref = np.load(golden / case / f"flow_{key}.npy")
        assert out[key].shape == ref.shape, key
        err = float(np.abs(out[key].numpy() - ref).max())
        print(f"{case} flow_{key}: max abs err {err:.2e}")
        assert err <= tol, (key, err)
    assert float(np.abs(out["mel"].numpy() - np.load(golden / case / "flow_mel.npy")).max()) < 1e-4  # expected ~5e-6


def test_baked_constants_match_torch_within_an_ulp() -> None:
    """The time-embedding and rotary frequencies the graphs bake in are the official float32 torch
    expressions, computed once in float64 and rounded (torch's own exp/pow differ in the last bit
    between its AVX2 and AVX-512 kernels, so the reference is compared within 1 float32 ulp)."""
    step = math.log(10000) / 127
    torch.testing.assert_close(time_frequencies(128), torch.exp(torch.arange(128, dtype=torch.float32) * -step),
                               rtol=1.2e-7, atol=0)  # exact: within 1 float32 ulp (docstring)
    for dim, theta in ((4, 1e6), (64, 1e6), (16, 1e4), (64, 1e4)):
        ref = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        torch.testing.assert_close(rope_inverse_frequencies(dim, theta), ref, rtol=1.2e-7, atol=0)  # exact: within 1 float32 ulp (docstring)
    with pytest.raises(ValueError, match="rounding boundary"):
        exact_float32([1.0 + 2.0**-24], "midpoint")  # halfway between two float32s


def test_block_mask() -> None:
    allowed = attention_allowed(torch.ones(1, 1, 120), torch.tensor([50]))[0, 0]
    assert allowed[0, 49] and not allowed[0, 50] and allowed[49, 49] and not allowed[49, 50]
    assert allowed[50, 99] and not allowed[50, 100] and allowed[119, 119] and allowed[100, 0]
    assert attention_allowed(torch.ones(1, 1, 120), torch.tensor([0])).all()
    padded = torch.ones(1, 1, 10)
    padded[..., 8:] = 0
    assert not attention_allowed(padded, torch.tensor([0]))[0, 0, :, 8:].any()


def test_block_causal_prefix_unchanged(flow: CosyFlow, noise: torch.Tensor, golden: Path) -> None:
    """§5.5: with the 50-frame block-causal DiT and the fixed noise, re-running on a longer input
    reproduces the earlier frames (streaming call shape: finalize=False)."""
    tokens = _load(golden, "en", "speech_token")
    prompt = _load(golden, "en", "prompt_speech_token")
    feat = _load(golden, "en", "prompt_feat")
    emb = _load(golden, "en", "speaker_embedding")
    # prompt 77 tokens + 23 pad so the first chunk ends on a 50-frame boundary, + 3 look-ahead
    short = flow_inference(flow, noise, tokens[:, : 23 + 3], prompt, feat, emb, finalize=False, streaming=True)
    long = flow_inference(flow, noise, tokens[:, : 48 + 3], prompt, feat, emb, finalize=False, streaming=True)
    n = short["mel"].shape[2]
    assert n == 2 * 23 and long["mel"].shape[2] == 2 * 48
    assert float((long["mel"][:, :, :n] - short["mel"]).abs().max()) <= 1e-5
    # full attention does look ahead: the same prefix changes
    full = flow_inference(flow, noise, tokens[:, : 48 + 3], prompt, feat, emb, finalize=False, streaming=False)
    assert float((full["mel"][:, :, :n] - short["mel"]).abs().max()) > 1e-3


def test_dims_checked_against_weights(tiny_official: Path, tmp_path: Path) -> None:
    text = (tiny_official / "cosyvoice3.yaml").read_text().replace("        channels: 48\n", "        channels: 64\n")
    model = tmp_path / "m"
    (model / "CosyVoice-BlankEN").mkdir(parents=True)
    (model / "CosyVoice-BlankEN" / "config.json").write_bytes((tiny_official / "CosyVoice-BlankEN" / "config.json").read_bytes())
    (model / "cosyvoice3.yaml").write_text(text)
    (model / "flow.pt").symlink_to(tiny_official / "flow.pt")
    assert load_model_config(model).flow.pre_lookahead_channels == 64
    with pytest.raises(CheckpointError, match=r"flow\.pt: flow\.pre_lookahead_layer\.channels is 64 in the config but 48"):
        load_flow(model)


def _session(path: Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def test_flow_front_onnx(flow: CosyFlow, golden: Path, tmp_path: Path) -> None:
    path = tmp_path / "flow_front.fp32.onnx"
    entry = export_flow_front(flow, path)
    assert [i["name"] for i in entry["inputs"]] == ["tokens", "embedding"]
    assert [o["name"] for o in entry["outputs"]] == ["mu", "spks"]
    sess = _session(path)
    emb = _load(golden, "en", "speaker_embedding")
    toks = torch.cat([_load(golden, "en", "prompt_speech_token"), _load(golden, "en", "speech_token")], 1).to(torch.int64)
    final = torch.cat([toks, torch.full((1, 3), -1, dtype=torch.int64)], 1)
    for tokens in (final, toks[:, :60]):  # finalize (−1 pad) and streaming (real look-ahead context)
        mu_t, spks_t = flow.front(tokens, emb)
        mu_o, spks_o = sess.run(None, {"tokens": tokens.numpy(), "embedding": emb.numpy()})
        assert mu_o.shape == (1, 80, 2 * (tokens.shape[1] - 3))
        assert _rel(mu_o, mu_t.numpy()) <= 1e-4 and _rel(spks_o, spks_t.numpy()) <= 1e-4
    ref = np.load(golden / "en" / "flow_mu.npy")
    mu_o, _ = sess.run(None, {"tokens": final.numpy(), "embedding": emb.numpy()})
    assert float(np.abs(mu_o - ref).max()) <= 1e-3


def _dit_inputs(batch: int, frames: int, block: int, scale: float, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(batch, 80, frames, generator=g) * scale,
        "mask": torch.ones(batch, 1, frames),
        "mu": torch.randn(batch, 80, frames, generator=g),
        "t": torch.rand(batch, generator=g),
        "spks": torch.randn(batch, 80, generator=g),
        "cond": torch.randn(batch, 80, frames, generator=g),
        "block_frames": torch.tensor([block], dtype=torch.int64),
    }


from cosy_export.quant import quantize_int8  # noqa: E402


def _no_cache(flow: CosyFlow, batch: int, record: int = 0) -> dict[str, np.ndarray]:
    """The cache inputs of a call without cached frames (zero conv context = the convs' zero pad)."""
    c = flow.dit.cfg
    empty = np.zeros((c.depth, batch, 0, c.heads * c.dim_head), np.float32)
    zeros = np.zeros((batch, CONV_POS_KERNEL - 1, c.dim), np.float32)
    return {"cache_k": empty, "cache_v": empty, "cache_conv1": zeros, "cache_conv2": zeros,
            "record_frames": np.array([record], np.int64)}


def test_dit_onnx_and_mixed_fp16(flow: CosyFlow, noise: torch.Tensor, golden: Path, tmp_path: Path) -> None:
    path = tmp_path / "dit.fp32.onnx"
    entry = export_dit(flow.dit, path)
    assert [i["name"] for i in entry["inputs"]] == DIT_INPUTS + DIT_CACHE_INPUTS
    assert [o["name"] for o in entry["outputs"]] == DIT_OUTPUTS
    proto = onnx.load(str(path))
    assert [i.name for i in proto.graph.input] == DIT_INPUTS + DIT_CACHE_INPUTS
    sess = _session(path)
    for batch, frames, block in ((2, 130, 50), (2, 130, 0), (1, 37, 0), (4, 101, 50)):
        ins = _dit_inputs(batch, frames, block, 1.0, frames)
        ref = flow.dit(**ins).numpy()
        out = sess.run(None, {k: v.numpy() for k, v in ins.items()} | _no_cache(flow, batch))[0]
        err = _rel(out, ref)
        print(f"dit onnx b={batch} T={frames} block={block}: max rel err {err:.2e}")
        assert err <= 1e-4

    # the fp32 graph in the Euler loop reproduces golden flow_mel
    class OrtDit:
        def __call__(self, *args: torch.Tensor) -> torch.Tensor:
            feed = dict(zip(DIT_INPUTS, (a.numpy() for a in args))) | _no_cache(flow, args[0].shape[0])
            return torch.from_numpy(sess.run(None, feed)[0])

    case = "p16k"
    ref_mu = torch.from_numpy(np.load(golden / case / "flow_mu.npy"))
    cond = torch.from_numpy(np.load(golden / case / "flow_cond.npy"))
    spks = flow.speaker(_load(golden, case, "speaker_embedding"))
    mel = cfm_solve(OrtDit(), noise, ref_mu, spks, cond)  # type: ignore[arg-type]
    prompt_frames = np.load(golden / case / "prompt_feat.npy").shape[1]
    assert float(np.abs(mel[:, :, prompt_frames:].numpy() - np.load(golden / case / "flow_mel.npy")).max()) <= 1e-3

    mixed_path = tmp_path / "dit.fp16.onnx"
    make_dit_mixed_fp16(path, mixed_path)
    mixed = onnx.load(str(mixed_path))
    assert [i.type.tensor_type.elem_type for i in mixed.graph.input][:1] == [onnx.TensorProto.FLOAT]
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in mixed.graph.initializer)
    msess = _session(mixed_path)
    for scale in (1.0, 1e3, 1e4):
        ins = {k: v.numpy() for k, v in _dit_inputs(2, 120, 50, scale, 7).items()} | _no_cache(flow, 2)
        out = msess.run(None, ins)[0]
        ref = sess.run(None, ins)[0]
        assert np.isfinite(out).all(), scale
        assert _rel(out, ref) <= 0.1, (scale, _rel(out, ref))


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("cached", [0, 50, 100, 150])
def test_dit_continues_after_cached_frames(flow: CosyFlow, tmp_path: Path, cached: int, precision: str) -> None:
    """The prompt-prefix cache (docs/model-format.md): a block-causal call that records the first
    `cached` frames' keys/values and conv contexts, then a call over only the remaining frames with
    that state, gives the remaining frames' velocity of the single call (within 1e-6 here: the
    same ops on the same rows; the runtime's test allows 1e-5). Batch 4 with one row padded. int8
    too: its activations are quantised per frame (cosy_export/quant.py), so a frame's velocity does
    not depend on which other frames share the call."""
    path = tmp_path / "dit.fp32.onnx"
    export_dit(flow.dit, path)
    if precision == "int8":
        quantize_int8(path, tmp_path / "dit.int8.onnx")
        path = tmp_path / "dit.int8.onnx"
    sess = _session(path)
    frames = 180
    ins = {k: v.numpy() for k, v in _dit_inputs(4, frames, 50, 1.0, cached).items()}
    ins["mask"][3, :, frames - 17:] = 0  # a shorter request in the batch, right-padded
    full, rec_k, rec_v, rec_c1, rec_c2 = sess.run(None, ins | _no_cache(flow, 4, cached))
    assert rec_k.shape == (flow.dit.cfg.depth, 4, cached, flow.dit.cfg.heads * flow.dit.cfg.dim_head)
    rest = {k: (v[:, :, cached:] if v.ndim == 3 else v) for k, v in ins.items()}
    state = {"cache_k": rec_k, "cache_v": rec_v, "cache_conv1": rec_c1, "cache_conv2": rec_c2,
             "record_frames": np.array([0], np.int64)}
    tail = sess.run(None, rest | state)[0]
    valid = frames - cached - 17
    assert float(np.abs(tail[:3] - full[:3, :, cached:]).max()) <= 1e-6
    assert float(np.abs(tail[3, :, :valid] - full[3, :, cached:cached + valid]).max()) <= 1e-6

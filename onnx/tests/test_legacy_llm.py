"""Model folders exported before batching still run: their `llm` graph has no attention_mask or
position_ids (batch 1, positions from the past length). A copy of the bundled fixture with such a
graph (same weights) must give `cosy file --input` (two lines at once) the same speech tokens and
audio as the fixture's batched graph."""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from conftest import REPO, cosy_bin, skip_or_fail
from cosy_export.__main__ import FIXTURE_SEED
from cosy_export.llm import CosyLlm, load_llm
from cosy_export.manifest import graph_entry
from cosy_export.random_model import write_random_model


class _LegacyLlm(nn.Module):
    """The pre-batching I/O: inputs_embeds [1, seq, hidden] and the cache only."""

    def __init__(self, llm: CosyLlm) -> None:
        super().__init__()
        self.llm = llm

    def forward(self, inputs_embeds: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        cache = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
        logits, present = self.llm.forward_step(inputs_embeds, cache)
        return (logits, *[t for kv in present for t in kv])


def _export_legacy(llm: CosyLlm, path: Path) -> None:
    cfg = llm.cfg
    names_in = ["inputs_embeds"] + [f"past_key_values.{i}.{k}" for i in range(cfg.num_layers) for k in ("key", "value")]
    names_out = ["logits"] + [f"present.{i}.{k}" for i in range(cfg.num_layers) for k in ("key", "value")]
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, 3, cfg.hidden_size, generator=gen)
    past = [torch.randn(1, cfg.num_kv_heads, 2, cfg.head_dim, generator=gen) for _ in range(2 * cfg.num_layers)]
    dynamic = {"inputs_embeds": {1: "seq"}, **{n: {2: "past"} for n in names_in[1:]}, **{n: {2: "past_plus_seq"} for n in names_out[1:]}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_LegacyLlm(llm), (embeds, *past), str(path), input_names=names_in, output_names=names_out,
                          dynamic_axes=dynamic, opset_version=17, do_constant_folding=True, dynamo=False)



def _run(model: Path, lines: Path, out: Path) -> list[np.ndarray]:
    out.mkdir()
    env = {"PATH": "/usr/bin:/bin", "COSY_GRAPH_CACHE": str(out.parent / "graphs"), "HOME": str(out.parent)}
    cmd = [str(cosy_bin()), "--model", str(model), "--provider", "cpu", "--set", "engine.file_concurrency=2", "file",
           "--input", str(lines), "--prompt-wav", str(REPO / "tests/fixtures/prompt_24k.wav"),
           "--prompt-text", "This recording is the voice prompt.", "--seed", "5", "--min-tokens", "30", "-o", str(out)]
    st = subprocess.run(cmd, capture_output=True, text=True, cwd=out.parent)
    assert st.returncode == 0, st.stderr
    import wave

    def read(p: Path) -> np.ndarray:
        with wave.open(str(p)) as w:
            assert w.getsampwidth() == 2
            return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")

    return [read(p) for p in sorted(out.iterdir())]


def test_folder_without_batched_llm_still_runs(tmp_path: Path) -> None:
    fixture = REPO / "tests/fixtures/tiny"
    src = tmp_path / "official"
    write_random_model(src, size="tiny", seed=FIXTURE_SEED)  # the fixture's weights
    legacy = tmp_path / "legacy"
    shutil.copytree(fixture, legacy)
    for f in legacy.glob("llm.*.onnx"):
        f.unlink()
    _export_legacy(load_llm(src), legacy / "llm.fp32.onnx")
    manifest = json.loads((legacy / "manifest.json").read_text())
    entry = graph_entry(legacy, {"fp32": "llm.fp32.onnx"}, {})
    del entry["batching"]  # as written before the key existed
    manifest["graphs"]["llm"] = entry
    (legacy / "manifest.json").write_text(json.dumps(manifest, indent=1))
    assert [i["name"] for i in entry["inputs"]][:2] == ["inputs_embeds", "past_key_values.0.key"]

    lines = tmp_path / "lines.txt"
    lines.write_text("The first line of two.\nAnd the second line, said beside it.\n")
    new = _run(fixture, lines, tmp_path / "new")
    old = _run(legacy, lines, tmp_path / "old")
    assert len(new) == len(old) == 2
    for a, b in zip(new, old):
        assert a.shape == b.shape  # same tokens (30 forced) and chunking
        # both graphs compute the same attention; floats may differ in the last bits
        assert np.abs(a.astype(np.int32) - b.astype(np.int32)).max() <= 2

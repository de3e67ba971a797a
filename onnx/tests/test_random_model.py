"""random_model.py: official layout, key sets/shapes, determinism, ONNX stand-in I/O."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml

from cosy_export import random_model as RM
from cosy_export import tokenizer as T

EXPECTED_FILES = [
    "CosyVoice-BlankEN/config.json",
    "CosyVoice-BlankEN/generation_config.json",
    "CosyVoice-BlankEN/merges.txt",
    "CosyVoice-BlankEN/tokenizer_config.json",
    "CosyVoice-BlankEN/vocab.json",
    "campplus.onnx",
    "cosyvoice3.yaml",
    "flow.pt",
    "hift.pt",
    "llm.pt",
    "speech_tokenizer_v3.onnx",
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return RM.write_random_model(tmp_path_factory.mktemp("rand") / "tiny", "tiny", seed=7)


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


class _PermissiveLoader(yaml.SafeLoader):
    """Reads hyperpyyaml tags (!new:, !name:, !apply:, !ref) as plain data."""


def _tagged(loader: yaml.SafeLoader, tag_suffix: str, node: yaml.Node) -> dict:
    if isinstance(node, yaml.MappingNode):
        value = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
    return {"__tag__": tag_suffix, "value": value}


_PermissiveLoader.add_multi_constructor("!", lambda loader, suffix, node: _tagged(loader, suffix, node))


def _load_yaml(path: Path) -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_PermissiveLoader)  # noqa: S506 - safe loader subclass


def test_layout_and_size(tiny_dir: Path) -> None:
    files = sorted(str(p.relative_to(tiny_dir)) for p in tiny_dir.rglob("*") if p.is_file())
    assert files == EXPECTED_FILES  # no model.safetensors
    total = sum((tiny_dir / f).stat().st_size for f in files)
    assert total < 25_000_000


def test_state_dicts_match_reference_tiny_keys_and_shapes(tiny_dir: Path, tiny_official: Path) -> None:
    """Our key lists (derived from the sizes) equal the official modules' state dicts, in order."""
    for name in ["llm", "flow", "hift"]:
        ours = torch.load(tiny_dir / f"{name}.pt", weights_only=True)
        ref = torch.load(tiny_official / f"{name}.pt", weights_only=True)
        assert list(ours) == list(ref), name
        for key in ref:
            assert ours[key].shape == ref[key].shape and ours[key].dtype == torch.float32, key
        assert all(torch.isfinite(t).all() for t in ours.values())


def test_state_dict_contents(tiny_dir: Path) -> None:
    llm = torch.load(tiny_dir / "llm.pt", weights_only=True)
    assert llm["llm.model.lm_head.weight"].data_ptr() == llm["llm.model.model.embed_tokens.weight"].data_ptr()
    assert abs(float(llm["llm_decoder.weight"].std()) * math.sqrt(16) - 4.0) < 0.2  # logits ~ N(0, 16)
    assert abs(float(llm["speech_embedding.weight"].std()) - 1.0) < 0.05

    flow = torch.load(tiny_dir / "flow.pt", weights_only=True)
    inv_freq = flow["decoder.estimator.rotary_embed.inv_freq"]
    expected = torch.tensor([10000.0 ** (-2 * j / 16) for j in range(8)], dtype=torch.float32)
    torch.testing.assert_close(inv_freq, expected, rtol=1e-6, atol=0)  # exact: not needed, a relative tolerance that holds on any CPU

    hift = torch.load(tiny_dir / "hift.pt", weights_only=True)
    for key, g in hift.items():
        if key.endswith("original0") and not key.startswith("conv_post"):
            v = hift[key.replace("original0", "original1")]
            torch.testing.assert_close(g.flatten(), v.flatten(1).norm(dim=1), rtol=1e-5, atol=0)  # exact: not needed, a relative tolerance
    alphas = torch.cat([t for k, t in hift.items() if k.endswith(".alpha")])
    assert abs(float(alphas.mean()) - 1.0) < 0.05
    assert float(hift["f0_predictor.classifier.bias"].abs().max()) == 0.0  # set to zero, not computed


@pytest.mark.parametrize("size", ["tiny", "full"])
def test_key_lists_follow_appendices(size: str) -> None:
    """Parameter counts of the full size equal the released files' (cosyvoice3.md §1.1, App. A/B)."""
    s = RM.SIZES[size]
    counts = {
        "flow": sum(math.prod(shape) for _, shape, _ in RM.flow_param_shapes(s)),
        "hift": sum(math.prod(shape) for _, shape, _ in RM.hift_param_shapes(s)),
        # lm_head is tied: stored once.
        "llm": sum(math.prod(shape) for _, shape, kind in RM.llm_param_shapes(s) if kind != RM.TIED),
    }
    assert len(RM.flow_param_shapes(s)) == 22 + 14 * s.dit_depth
    assert len(RM.hift_param_shapes(s)) == 328
    if size == "full":
        assert counts == {"flow": 332_257_120, "hift": 20_779_887, "llm": 506_148_480}
    else:
        # The reference tiny llm.pt holds 5,084,592 values when lm_head is counted as well.
        assert counts == {"flow": 713_720, "hift": 71_180, "llm": 5_084_592 - 151936 * 16}


def test_yaml_parses_with_our_sizes(tiny_dir: Path, tiny_official: Path) -> None:
    ours = _load_yaml(tiny_dir / "cosyvoice3.yaml")
    ref = _load_yaml(tiny_official / "cosyvoice3.yaml")
    # The reference tiny differs only in its greedy sampling values.
    ref["llm"]["value"]["sampling"]["value"].update({"top_k": 25, "tau_r": 0.1})
    assert ours == ref
    estimator = ours["flow"]["value"]["decoder"]["value"]["estimator"]
    assert estimator["__tag__"] == "new:cosyvoice.flow.DiT.dit.DiT"
    assert (estimator["value"]["dim"], estimator["value"]["depth"]) == (48, 3)

    full = yaml.load(RM.render_yaml(RM.SIZES["full"], "full", 0), Loader=_PermissiveLoader)  # noqa: S506
    assert full["llm_input_size"] == 896
    assert full["hift"]["value"]["base_channels"] == 512
    assert full["llm"]["value"]["sampling"]["value"]["top_k"] == 25
    greedy = yaml.load(RM.render_yaml(RM.SIZES["tiny"], "tiny", 0, greedy=True), Loader=_PermissiveLoader)  # noqa: S506
    assert greedy["llm"]["value"]["sampling"]["value"] == ref["llm"]["value"]["sampling"]["value"] | {"top_k": 1, "tau_r": 2.0}


def test_blanken_tokenizer(tiny_dir: Path, tmp_path: Path) -> None:
    blanken = tiny_dir / "CosyVoice-BlankEN"
    config = json.loads((blanken / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (16, 2, 4)
    assert (config["num_key_value_heads"], config["intermediate_size"]) == (2, 48)
    assert config["vocab_size"] == 151936 and config["tie_word_embeddings"] is True
    vocab = json.loads((blanken / "vocab.json").read_text(encoding="utf-8"))
    assert sorted(vocab.values()) == list(range(151643))
    merges = T.read_merges(blanken / "merges.txt")
    assert len(merges) >= 300
    tok = T.build_tokenizer_json(blanken, tmp_path / "tokenizer.json")  # checks 151646.. itself
    assert tok.token_to_id("<|endoftext|>") == 151643 and tok.token_to_id("[ǜ]") == 151923
    text = "The weather was calm. 今天的天气很好。"
    ids = tok.encode(text).ids
    assert max(ids) < 640 and len(ids) < len(text.encode()) / 2  # learned merges are used, fillers never are
    assert tok.decode(ids) == "The weather was calm. 今天的天气很好。"


def test_onnx_standins_io(tiny_dir: Path) -> None:
    campplus = ort.InferenceSession(str(tiny_dir / "campplus.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in campplus.get_inputs()] == [("input", "tensor(float)")]
    assert [(o.name, o.type) for o in campplus.get_outputs()] == [("output", "tensor(float)")]
    emb = campplus.run(None, {"input": np.random.default_rng(0).standard_normal((2, 37, 80)).astype(np.float32)})[0]
    assert emb.shape == (2, 192) and np.isfinite(emb).all()

    tok = ort.InferenceSession(str(tiny_dir / "speech_tokenizer_v3.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type) for i in tok.get_inputs()] == [("feats", "tensor(float)"), ("feats_length", "tensor(int32)")]
    assert [(o.name, o.type) for o in tok.get_outputs()] == [("indices", "tensor(int32)")]
    rng = np.random.default_rng(1)
    for frames in [5, 8, 310, 311, 313]:
        feats = rng.standard_normal((1, 128, frames)).astype(np.float32)
        out = tok.run(None, {"feats": feats, "feats_length": np.array([frames], np.int32)})[0]
        assert out.shape == (1, math.ceil(math.ceil(frames / 2) / 2)) and out.dtype == np.int32
        assert out.min() >= 0 and out.max() < 6561


def test_speech_tokenizer_standin_is_fsq(tiny_dir: Path) -> None:
    """The ONNX graph equals the torch module; codes decompose into 8 base-3 digits of the FSQ levels."""
    module = RM.StandInSpeechTokenizer()
    RM._init_module(module, torch.Generator().manual_seed(7 * 1000 + 4))
    feats = torch.randn(1, 128, 200, generator=torch.Generator().manual_seed(3)) * 0.5
    length = torch.tensor([200], dtype=torch.int32)
    ref = module(feats, length).numpy()
    sess = ort.InferenceSession(str(tiny_dir / "speech_tokenizer_v3.onnx"), providers=["CPUExecutionProvider"])
    out = sess.run(None, {"feats": feats.numpy(), "feats_length": length.numpy()})[0]
    # discrete FSQ codes: 0.999·tanh(z) stays >= 7.6e-3 from a rounding boundary on this input, far beyond
    # the ORT-vs-torch (or CPU-to-CPU) float differences
    np.testing.assert_array_equal(out, ref)
    with torch.no_grad():
        z = module.conv2(torch.nn.functional.gelu(module.conv1(feats - feats.mean(dim=2, keepdim=True)))) * module.gain
    digits = (torch.round(0.999 * torch.tanh(z)) + 1).to(torch.int64)[0]  # [8, T]
    codes = sum(digits[i] * 3**i for i in range(8)).numpy()
    np.testing.assert_array_equal(out[0], codes)  # the same codes, same margin as above
    assert len(set(out[0].tolist())) > 10  # codes follow the input, not one constant


def test_deterministic_and_seed_dependent(tiny_dir: Path, tmp_path: Path) -> None:
    again = RM.write_random_model(tmp_path / "again", "tiny", seed=7)
    assert _digests(again) == _digests(tiny_dir)  # same process, same draws and maths: identical bytes
    other = RM.write_random_model(tmp_path / "other", "tiny", seed=8)
    a, b = _digests(tiny_dir), _digests(other)
    for name in ["llm.pt", "flow.pt", "hift.pt", "campplus.onnx", "speech_tokenizer_v3.onnx", "cosyvoice3.yaml"]:
        assert a[name] != b[name], name
    assert a["CosyVoice-BlankEN/vocab.json"] == b["CosyVoice-BlankEN/vocab.json"]


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RM.write_random_model(tmp_path, "medium", 0)
    with pytest.raises(ValueError):
        RM.write_random_model(tmp_path, "tiny", -1)

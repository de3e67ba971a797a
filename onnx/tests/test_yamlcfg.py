"""yamlcfg: hyperpyyaml tags as plain data, references, arithmetic, typed config and errors."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from cosy_export.yamlcfg import (
    APPLY_KEY,
    CLASS_KEY,
    NAME_KEY,
    ConfigError,
    iter_tagged,
    load_model_config,
    load_yaml,
    load_yaml_text,
    new_objects,
)


def test_tags_refs_and_arithmetic() -> None:
    text = """
__seed: !apply:torch.manual_seed [1986]
a: 25
b: 2
eps: 1e-06
neg: -1
prod: !ref <a> * <b>
expr: !ref (<a> + 3) / <b> - -1
obj: !new:pkg.mod.Outer
    x: !ref <a>
    inner: !new:pkg.mod.Inner
        y: 1
    fn: !name:pkg.f
        k: 2
    empty: !new:pkg.Empty
alias: !ref <obj>
lst: [!ref <b>, 3]
"""
    raw = load_yaml_text(text)
    assert raw["eps"] == pytest.approx(1e-6) and isinstance(raw["eps"], float)
    assert raw["prod"] == 50
    assert raw["expr"] == pytest.approx(15.0)
    assert raw["obj"][CLASS_KEY] == "pkg.mod.Outer"
    assert list(raw["obj"].keys()) == [CLASS_KEY, "x", "inner", "fn", "empty"]
    assert raw["obj"]["x"] == 25
    assert raw["obj"]["fn"] == {NAME_KEY: "pkg.f", "k": 2}
    assert raw["alias"] is raw["obj"]  # shared object, like hyperpyyaml
    assert raw["lst"] == [2, 3]
    assert [d[APPLY_KEY] for d in iter_tagged(raw, APPLY_KEY)] == ["torch.manual_seed"]
    order = [(path, cls) for path, cls, _ in new_objects(raw)]
    # nested arguments first, in document order; the alias is not built twice
    assert order == [("obj.inner", "pkg.mod.Inner"), ("obj.empty", "pkg.Empty"), ("obj", "pkg.mod.Outer")]


def test_ref_errors() -> None:
    with pytest.raises(ConfigError, match="nothere"):
        load_yaml_text("a: !ref <nothere>\n")
    with pytest.raises(ConfigError, match="unsupported expression"):
        load_yaml_text("a: 1\nb: !ref <a> ** 2 + __import__('os')\n")
    with pytest.raises(ConfigError, match="not a number"):
        load_yaml_text("a: x\nb: !ref <a> * 2\n")


def test_tiny_official_config(tiny_official: Path) -> None:
    cfg = load_model_config(tiny_official)
    assert cfg.llm.hidden_size == 16 and cfg.llm.num_layers == 2
    assert (cfg.llm.num_heads, cfg.llm.num_kv_heads, cfg.llm.head_dim) == (4, 2, 4)
    assert cfg.llm.rope_theta == 1e6 and cfg.llm.rms_norm_eps == 1e-6
    assert cfg.llm.speech_vocab_size == 6761 and cfg.llm.sos == 6561 and cfg.llm.task_id == 6563
    assert cfg.llm.sampling == {"top_p": 0.8, "top_k": 1, "win_size": 10, "tau_r": 2.0}
    assert cfg.flow.dit.static_chunk_size == 50  # !ref <chunk_size> * <token_mel_ratio>
    assert (cfg.flow.dit.dim, cfg.flow.dit.depth, cfg.flow.dit.heads, cfg.flow.dit.dim_head) == (48, 3, 3, 16)
    assert cfg.flow.pre_lookahead_channels == 48 and cfg.flow.inference_cfg_rate == 0.7
    assert cfg.flow.sigma_min == pytest.approx(1e-6)
    assert cfg.hift_raw["f0_predictor"]["cond_channels"] == 24
    assert cfg.hift_raw["sampling_rate"] == 24000
    assert cfg.raw["qwen_pretrain_path"].endswith("CosyVoice-BlankEN")
    classes = [cls.rsplit(".", 1)[-1] for _, cls, _ in cfg.new_objects()]
    assert classes.index("CausalConditionalCFM") < classes.index("CausalMaskedDiffWithDiT")
    assert classes.index("DiT") < classes.index("CausalConditionalCFM")
    assert classes.index("CausalConvRNNF0Predictor") < classes.index("CausalHiFTGenerator")


def test_errors_name_key_and_file(tiny_official: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cosyvoice3.yaml"):
        load_yaml(tmp_path / "cosyvoice3.yaml")
    model = tmp_path / "m"
    shutil.copytree(tiny_official / "CosyVoice-BlankEN", model / "CosyVoice-BlankEN",
                    ignore=shutil.ignore_patterns("*.safetensors", "*.txt", "vocab.json"))
    text = (tiny_official / "cosyvoice3.yaml").read_text()
    (model / "cosyvoice3.yaml").write_text(re.sub(r"(?m)^ *depth: 3\n", "", text))
    with pytest.raises(ConfigError, match=r"cosyvoice3\.yaml.*flow\.decoder\.estimator\.depth"):
        load_model_config(model)
    (model / "cosyvoice3.yaml").write_text(text)
    qwen = json.loads((model / "CosyVoice-BlankEN" / "config.json").read_text())
    del qwen["num_key_value_heads"]
    (model / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen))
    with pytest.raises(ConfigError, match=r"config\.json.*num_key_value_heads"):
        load_model_config(model)
    qwen["num_key_value_heads"] = 2
    qwen["hidden_size"] = 32
    (model / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen))
    with pytest.raises(ConfigError, match="llm_input_size = 16"):
        load_model_config(model)

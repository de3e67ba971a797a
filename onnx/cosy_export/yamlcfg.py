"""Read an official `cosyvoice3.yaml` (hyperpyyaml dialect) without importing the official code.

hyperpyyaml builds Python objects while it loads. We only need the numbers, so every tag becomes
plain data:

* `!new:a.b.C` with a mapping  -> ``{"__class__": "a.b.C", **mapping}`` (keys in document order);
  with a sequence the arguments go under ``"__args__"``; with an empty scalar the dict has no arguments.
* `!name:a.b.f` -> ``{"__name__": "a.b.f", **mapping}``.
* `!apply:a.b.f [args]` -> ``{"__apply__": "a.b.f", "__args__": [...]}`` (recorded, never called).
* `!ref <key>` -> the value of that key (same Python object, so a referenced `!new:` object is the
  same dict, as hyperpyyaml shares the object); `!ref <a> * <b>` evaluates + - * / // % and
  parentheses over numbers with a small AST walker (never `eval`).

Mappings are Python dicts, which keep document order. `new_objects(raw)` lists the `!new:` objects in
hyperpyyaml's construction order (depth-first, arguments before the object that receives them), which
the construction-time noise replay (cosyvoice3.md §11) needs.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

CLASS_KEY = "__class__"
NAME_KEY = "__name__"
APPLY_KEY = "__apply__"
ARGS_KEY = "__args__"


class ConfigError(ValueError):
    """A config file is missing, malformed, or lacks a key we need (message names key and file)."""


# ----------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------


class _Ref:
    """Placeholder for `!ref <...>`; resolved after the whole document is loaded."""

    def __init__(self, expr: str) -> None:
        self.expr = expr

    def __repr__(self) -> str:
        return f"_Ref({self.expr!r})"


class _HyperLoader(yaml.SafeLoader):
    """SafeLoader plus the hyperpyyaml tags and YAML-1.2 style floats such as `1e-06`."""


# PyYAML (YAML 1.1) reads `1e-06` as a string because it lacks a dot; hyperpyyaml (ruamel, YAML 1.2)
# reads a float. Register a resolver that accepts the 1.2 float forms.
_FLOAT_RE = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)
_HyperLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_HyperLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))


def _construct_tagged(loader: _HyperLoader, node: yaml.Node, head: str, target: str) -> dict[str, Any]:
    out: dict[str, Any] = {head: target}
    if isinstance(node, yaml.MappingNode):
        out.update(loader.construct_mapping(node, deep=True))
    elif isinstance(node, yaml.SequenceNode):
        out[ARGS_KEY] = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node)
        if value not in ("", None):
            out[ARGS_KEY] = [value]
    return out


def _multi(head: str):
    def construct(loader: _HyperLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
        return _construct_tagged(loader, node, head, suffix)

    return construct


def _construct_ref(loader: _HyperLoader, node: yaml.Node) -> _Ref:
    if not isinstance(node, yaml.ScalarNode):
        raise yaml.constructor.ConstructorError(None, None, "!ref expects a scalar", node.start_mark)
    return _Ref(str(loader.construct_scalar(node)))


_HyperLoader.add_multi_constructor("!new:", _multi(CLASS_KEY))
_HyperLoader.add_multi_constructor("!name:", _multi(NAME_KEY))
_HyperLoader.add_multi_constructor("!apply:", _multi(APPLY_KEY))
_HyperLoader.add_constructor("!ref", _construct_ref)


_REF_TOKEN = re.compile(r"<([^<>]+)>")
_BIN_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_UNARY_OPS = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def _eval_arith(node: ast.AST, values: dict[str, Any], expr: str, file: Path) -> Any:
    if isinstance(node, ast.Expression):
        return _eval_arith(node.body, values, expr, file)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in values:
        return values[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
        return _BIN_OPS[type(node.op)](
            _eval_arith(node.left, values, expr, file), _eval_arith(node.right, values, expr, file)
        )
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_eval_arith(node.operand, values, expr, file))
    raise ConfigError(f"{file}: unsupported expression in !ref {expr!r} (only numbers and + - * / // %)")


class _Resolver:
    def __init__(self, root: dict[str, Any], file: Path) -> None:
        self.root = root
        self.file = file
        self.active: set[str] = set()
        self.done: dict[str, Any] = {}

    def lookup(self, key: str) -> Any:
        if key in self.done:
            return self.done[key]
        if key in self.active:
            raise ConfigError(f"{self.file}: circular !ref through <{key}>")
        parts = key.split(".")
        if parts[0] not in self.root:
            raise ConfigError(f"{self.file}: !ref <{key}> names no top-level key {parts[0]!r}")
        self.active.add(key)
        value = self.resolve(self.root[parts[0]])
        self.root[parts[0]] = value
        for part in parts[1:]:
            if not isinstance(value, dict) or part not in value:
                raise ConfigError(f"{self.file}: !ref <{key}>: no key {part!r}")
            value = value[part]
        self.active.discard(key)
        self.done[key] = value
        return value

    def ref(self, expr: str) -> Any:
        text = expr.strip()
        whole = _REF_TOKEN.fullmatch(text)
        if whole:
            return self.lookup(whole.group(1).strip())
        values: dict[str, Any] = {}

        def substitute(match: re.Match[str]) -> str:
            name = f"_r{len(values)}"
            value = self.lookup(match.group(1).strip())
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{self.file}: !ref {expr!r}: <{match.group(1)}> is not a number ({value!r})")
            values[name] = value
            return name

        python = _REF_TOKEN.sub(substitute, text)
        try:
            tree = ast.parse(python, mode="eval")
        except SyntaxError as err:
            raise ConfigError(f"{self.file}: cannot parse !ref {expr!r}: {err}") from None
        return _eval_arith(tree, values, expr, self.file)

    def resolve(self, node: Any) -> Any:
        if isinstance(node, _Ref):
            return self.ref(node.expr)
        if isinstance(node, dict):
            for key in list(node.keys()):
                node[key] = self.resolve(node[key])
            return node
        if isinstance(node, list):
            for i, item in enumerate(node):
                node[i] = self.resolve(item)
            return node
        return node


def load_yaml_text(text: str, file: Path | str = "<string>", overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse hyperpyyaml text into plain nested dicts/lists (see module doc). `overrides` replace
    top-level keys before references are resolved (like hyperpyyaml's `overrides=`)."""
    file = Path(file)
    try:
        data = yaml.load(text, Loader=_HyperLoader)  # noqa: S506 - SafeLoader subclass, data only
    except yaml.YAMLError as err:
        raise ConfigError(f"{file}: YAML error: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: top level is not a mapping")
    for key, value in (overrides or {}).items():
        data[key] = value
    resolver = _Resolver(data, file)
    for key in list(data.keys()):
        data[key] = resolver.resolve(data[key])
    return data


def load_yaml(path: Path | str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Read `cosyvoice3.yaml` (hyperpyyaml dialect) into plain nested dicts and lists."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err}") from None
    return load_yaml_text(text, path, overrides)


def new_objects(raw: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """`!new:` objects in hyperpyyaml construction order: depth-first over the document, each
    object's nested arguments before the object itself; an object reached again through `!ref`
    is not built twice. Returns (dotted path, class name, the object's dict)."""
    seen: set[int] = set()
    out: list[tuple[str, str, dict[str, Any]]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if id(node) in seen:
                return
            seen.add(id(node))
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else str(key))
            if CLASS_KEY in node:
                out.append((path, str(node[CLASS_KEY]), node))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{path}[{i}]")

    walk(raw, "")
    return out


# ----------------------------------------------------------------------------------------------
# Typed views
# ----------------------------------------------------------------------------------------------


def _get(node: dict[str, Any], path: str, file: Path, kind: type | tuple[type, ...] | None = None) -> Any:
    """`node["a"]["b"]` for path "a.b", with an error that names the key and the file."""
    value: Any = node
    walked: list[str] = []
    for part in path.split("."):
        walked.append(part)
        if not isinstance(value, dict) or part not in value:
            raise ConfigError(f"{file}: missing key {'.'.join(walked)!r}")
        value = value[part]
    if kind is not None:
        ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind))
        if not ok:
            raise ConfigError(f"{file}: key {path!r} should be {kind}, got {value!r}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


_NUM = (int, float)


@dataclass(frozen=True)
class LlmConfig:
    """CosyVoice3LM + its Qwen2 backbone (dims from CosyVoice-BlankEN/config.json)."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    text_vocab_size: int
    speech_token_size: int  # 6561 FSQ codes
    speech_vocab_size: int  # speech_token_size + 200 special/stop rows
    llm_input_size: int
    llm_output_size: int
    sampling: dict[str, Any] = field(default_factory=dict)  # top_p, top_k, win_size, tau_r

    @property
    def sos(self) -> int:
        return self.speech_token_size

    @property
    def eos(self) -> int:
        return self.speech_token_size + 1

    @property
    def task_id(self) -> int:
        return self.speech_token_size + 2

    @property
    def fill(self) -> int:
        return self.speech_token_size + 3


@dataclass(frozen=True)
class DitConfig:
    dim: int
    depth: int
    heads: int
    dim_head: int
    ff_mult: int
    mel_dim: int
    mu_dim: int
    spk_dim: int
    out_channels: int
    static_chunk_size: int
    num_decoding_left_chunks: int


@dataclass(frozen=True)
class FlowConfig:
    input_size: int  # mel dim (80)
    output_size: int
    spk_embed_dim: int
    vocab_size: int
    token_mel_ratio: int
    pre_lookahead_len: int
    pre_lookahead_channels: int
    cfm_in_channels: int
    cfm_spk_emb_dim: int
    t_scheduler: str
    inference_cfg_rate: float
    sigma_min: float
    dit: DitConfig


@dataclass(frozen=True)
class ModelConfig:
    model_dir: Path
    yaml_path: Path
    raw: dict[str, Any]  # the whole yaml as plain data
    llm: LlmConfig
    flow: FlowConfig
    hift_raw: dict[str, Any]  # the `hift` object dict; stage code builds its own typed view
    sample_rate: int
    token_frame_rate: int
    token_mel_ratio: int
    chunk_size: int

    def new_objects(self) -> list[tuple[str, str, dict[str, Any]]]:
        return new_objects(self.raw)


def _expect_class(node: Any, path: str, suffix: str, file: Path) -> dict[str, Any]:
    if not isinstance(node, dict) or CLASS_KEY not in node:
        raise ConfigError(f"{file}: key {path!r} should be a !new: object")
    if not str(node[CLASS_KEY]).endswith(suffix):
        raise ConfigError(f"{file}: key {path!r} is {node[CLASS_KEY]}, expected *{suffix}")
    return node


def _llm_config(raw: dict[str, Any], qwen: dict[str, Any], yaml_path: Path, qwen_path: Path) -> LlmConfig:
    llm = _expect_class(_get(raw, "llm", yaml_path), "llm", "CosyVoice3LM", yaml_path)
    hidden = int(_get(qwen, "hidden_size", qwen_path, int))
    heads = int(_get(qwen, "num_attention_heads", qwen_path, int))
    head_dim = int(qwen.get("head_dim", hidden // heads))
    speech_token_size = int(_get(llm, "speech_token_size", yaml_path, int))
    sampling = _get(llm, "sampling", yaml_path, dict)
    cfg = LlmConfig(
        hidden_size=hidden,
        num_layers=int(_get(qwen, "num_hidden_layers", qwen_path, int)),
        num_heads=heads,
        num_kv_heads=int(_get(qwen, "num_key_value_heads", qwen_path, int)),
        head_dim=head_dim,
        intermediate_size=int(_get(qwen, "intermediate_size", qwen_path, int)),
        rope_theta=float(_get(qwen, "rope_theta", qwen_path, _NUM)),
        rms_norm_eps=float(_get(qwen, "rms_norm_eps", qwen_path, _NUM)),
        text_vocab_size=int(_get(qwen, "vocab_size", qwen_path, int)),
        speech_token_size=speech_token_size,
        speech_vocab_size=speech_token_size + 200,
        llm_input_size=int(_get(llm, "llm_input_size", yaml_path, int)),
        llm_output_size=int(_get(llm, "llm_output_size", yaml_path, int)),
        sampling={k: v for k, v in sampling.items() if k != NAME_KEY},
    )
    if hidden % heads != 0 and "head_dim" not in qwen:
        raise ConfigError(f"{qwen_path}: hidden_size {hidden} not divisible by num_attention_heads {heads}")
    if cfg.num_heads % cfg.num_kv_heads != 0:
        raise ConfigError(
            f"{qwen_path}: num_attention_heads {cfg.num_heads} not a multiple of num_key_value_heads {cfg.num_kv_heads}"
        )
    for key in ("llm_input_size", "llm_output_size"):
        if getattr(cfg, key) != hidden:
            raise ConfigError(
                f"{yaml_path}: llm.{key} = {getattr(cfg, key)} but {qwen_path} hidden_size = {hidden}"
            )
    return cfg


def _flow_config(raw: dict[str, Any], file: Path) -> FlowConfig:
    flow = _expect_class(_get(raw, "flow", file), "flow", "CausalMaskedDiffWithDiT", file)
    pll = _expect_class(_get(flow, "pre_lookahead_layer", file), "flow.pre_lookahead_layer", "PreLookaheadLayer", file)
    dec = _expect_class(_get(flow, "decoder", file), "flow.decoder", "CausalConditionalCFM", file)
    est = _expect_class(_get(dec, "estimator", file), "flow.decoder.estimator", "DiT", file)
    cfm = _get(dec, "cfm_params", file, dict)
    cfm = cfm.get("content", cfm)  # omegaconf.DictConfig(content=...)

    def i(node: dict[str, Any], key: str, prefix: str) -> int:
        if key not in node:
            raise ConfigError(f"{file}: missing key {prefix + '.' + key!r}")
        return int(_get(node, key, file, int))

    dit = DitConfig(
        dim=i(est, "dim", "flow.decoder.estimator"),
        depth=i(est, "depth", "flow.decoder.estimator"),
        heads=int(est.get("heads", 8)),
        dim_head=int(est.get("dim_head", 64)),
        ff_mult=int(est.get("ff_mult", 4)),
        mel_dim=int(est.get("mel_dim", 100)),
        mu_dim=int(est.get("mu_dim", est.get("mel_dim", 100))),
        spk_dim=int(est.get("spk_dim", 0)),
        out_channels=int(est.get("out_channels", est.get("mel_dim", 100))),
        static_chunk_size=int(est.get("static_chunk_size", 50)),
        num_decoding_left_chunks=int(est.get("num_decoding_left_chunks", -1)),
    )
    return FlowConfig(
        input_size=i(flow, "input_size", "flow"),
        output_size=i(flow, "output_size", "flow"),
        spk_embed_dim=i(flow, "spk_embed_dim", "flow"),
        vocab_size=i(flow, "vocab_size", "flow"),
        token_mel_ratio=i(flow, "token_mel_ratio", "flow"),
        pre_lookahead_len=i(flow, "pre_lookahead_len", "flow"),
        pre_lookahead_channels=i(pll, "channels", "flow.pre_lookahead_layer"),
        cfm_in_channels=int(dec.get("in_channels", 240)),
        cfm_spk_emb_dim=int(dec.get("spk_emb_dim", 80)),
        t_scheduler=str(cfm.get("t_scheduler", "cosine")),
        inference_cfg_rate=float(_get(cfm, "inference_cfg_rate", file, _NUM)),
        sigma_min=float(cfm.get("sigma_min", 1e-6)),
        dit=dit,
    )


def load_model_config(model_dir: Path | str) -> ModelConfig:
    """Read `<model_dir>/cosyvoice3.yaml` and `<model_dir>/CosyVoice-BlankEN/config.json`."""
    model_dir = Path(model_dir)
    yaml_path = model_dir / "cosyvoice3.yaml"
    qwen_dir = model_dir / "CosyVoice-BlankEN"
    raw = load_yaml(yaml_path, overrides={"qwen_pretrain_path": str(qwen_dir)})
    qwen_path = qwen_dir / "config.json"
    try:
        qwen = json.loads(qwen_path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read {qwen_path}: {err}") from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{qwen_path}: invalid JSON: {err}") from None
    if not isinstance(qwen, dict):
        raise ConfigError(f"{qwen_path}: top level is not an object")
    hift = _expect_class(_get(raw, "hift", yaml_path), "hift", "HiFTGenerator", yaml_path)
    return ModelConfig(
        model_dir=model_dir,
        yaml_path=yaml_path,
        raw=raw,
        llm=_llm_config(raw, qwen, yaml_path, qwen_path),
        flow=_flow_config(raw, yaml_path),
        hift_raw=hift,
        sample_rate=int(_get(raw, "sample_rate", yaml_path, int)),
        token_frame_rate=int(_get(raw, "token_frame_rate", yaml_path, int)),
        token_mel_ratio=int(_get(raw, "token_mel_ratio", yaml_path, int)),
        chunk_size=int(_get(raw, "chunk_size", yaml_path, int)),
    )


def iter_tagged(node: Any, key: str) -> Iterator[dict[str, Any]]:
    """Every dict in `node` that carries `key` (e.g. APPLY_KEY), in document order."""
    if isinstance(node, dict):
        if key in node:
            yield node
        for value in node.values():
            yield from iter_tagged(value, key)
    elif isinstance(node, list):
        for item in node:
            yield from iter_tagged(item, key)

"""Official CosyVoice3 checkpoint folder -> exported model folder (docs/model-format.md).

The folder is written to a temporary sibling and renamed into place at the end, so a failed
export never leaves a half-written model folder behind.
"""

from __future__ import annotations

import datetime as _dt
import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import onnx
import torch
from safetensors.numpy import save_file

from . import __version__
from .flow import export_dit, export_flow_front, load_flow, make_dit_mixed_fp16
from .hift import HiftConfig, export_hift_decode, hift_side_tensors, load_hift, make_hift_decode_fp16
from .llm import export_llm, export_llm_fp16, export_llm_step, llm_graph_entry, load_llm
from .quant import INT8_STAGES, quantize_int8
from .manifest import FORMAT, FORMAT_VERSION, file_entry, graph_entry, graph_io, sha256_file
from .noise import NOISE_FRAMES, flow_noise, sine_noise, sine_noise_offset
from .tokenizer import build_tokenizer_json
from .yamlcfg import ModelConfig, load_model_config

OPSET = 17
PRECISIONS = ("fp32", "fp16", "int8")
# int8 is opt-in (--precisions fp32,fp16,int8): it adds ~3 min on 2 cores and ~0.7 GB for the
# full-size model, and it changes numerics (see docs/benchmarks.md for its measured cost).
DEFAULT_PRECISIONS = ("fp32", "fp16")
SILENT_TOKENS = [1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323]
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant.<|endofprompt|>"
REQUIRED_FILES = (
    "cosyvoice3.yaml",
    "llm.pt",
    "flow.pt",
    "hift.pt",
    "campplus.onnx",
    "speech_tokenizer_v3.onnx",
    "CosyVoice-BlankEN/config.json",
    "CosyVoice-BlankEN/vocab.json",
    "CosyVoice-BlankEN/merges.txt",
)


class ExportError(RuntimeError):
    """The source folder cannot be exported; the message names the file and the fix."""


@dataclass
class ExportOptions:
    precisions: Sequence[str] = DEFAULT_PRECISIONS
    # Columns of the fixed flow noise kept in side.safetensors (15000 = 300 s, the official size).
    # The bundled test fixture keeps fewer to stay small; the runtime refuses longer utterances.
    noise_frames: int = NOISE_FRAMES
    random: dict[str, Any] | None = None  # recorded in the manifest when the source is random
    # Keep only the text-embedding rows the tokenizer can produce (byte-level-alphabet tokens and
    # added tokens), stored with their ids. Only for small test folders: a real Qwen vocabulary
    # is fully reachable anyway.
    sparse_text_embedding: bool = False
    # Copy the wetext TN grammars into tn/ (about 8 MB; the bundled test fixture leaves them out).
    text_normalization: bool = True
    log: Callable[[str], None] = print
    timings: dict[str, float] = field(default_factory=dict)


def check_source(src: Path) -> None:
    if not src.is_dir():
        raise ExportError(f"{src}: not a folder; pass the official Fun-CosyVoice3-0.5B folder")
    for rel in REQUIRED_FILES:
        if not (src / rel).is_file():
            raise ExportError(f"{src / rel}: missing; the official checkpoint folder must contain {rel}")


def reachable_text_ids(tok: Any, vocab_rows: int) -> np.ndarray:
    """Ids the tokenizer can emit: vocabulary entries made only of byte-level alphabet characters
    (anything else, e.g. padding fillers, can never come out of the byte-level pre-tokenizer),
    plus every added token."""
    from tokenizers import pre_tokenizers

    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    ids = {i for t, i in tok.get_vocab(with_added_tokens=False).items() if set(t) <= alphabet}
    ids |= {i for i in tok.get_added_tokens_decoder()}
    return np.array(sorted(i for i in ids if i < vocab_rows), dtype=np.int64)


def _onnx_io_names(path: Path) -> dict[str, list[str]]:
    inputs, outputs = graph_io(path)
    return {"inputs": [i["name"] for i in inputs], "outputs": [o["name"] for o in outputs]}


def constants(cfg: ModelConfig, noise_frames: int) -> dict[str, Any]:
    llm = cfg.llm
    sampling = {"top_p": 0.8, "top_k": 25, "win_size": 10, "tau_r": 0.1}
    sampling.update({k: v for k, v in llm.sampling.items() if k in sampling})
    return {
        "sos": llm.sos,
        "eos": llm.eos,
        "task_id": llm.task_id,
        "fill": llm.fill,
        "stop_token_min": llm.speech_token_size,
        "stop_token_end": llm.speech_vocab_size,
        # Official quirk (cosyvoice3.md §4.2): ignore_eos masks index speech_token_size = sos.
        "ignore_eos_masked_id": llm.speech_token_size,
        "endofprompt_id": 151646,
        "default_system_prompt": DEFAULT_SYSTEM_PROMPT,
        "min_token_text_ratio": 2,
        "max_token_text_ratio": 20,
        "sampling": sampling,
        "silent_tokens": SILENT_TOKENS,
        "max_silent_run": 5,
        "streaming": {
            "chunk_size": cfg.chunk_size,
            "token_hop_len": cfg.chunk_size,
            "token_max_hop_len": 4 * cfg.chunk_size,
            "stream_scale_factor": 2,
            "pre_lookahead_len": cfg.flow.pre_lookahead_len,
            "dit_block_frames": cfg.flow.dit.static_chunk_size,
        },
        "cfm": {
            "n_timesteps": 10,
            "cfg_rate": cfg.flow.inference_cfg_rate,
            "t_scheduler": cfg.flow.t_scheduler,
        },
        "mel": {
            "n_fft": 1920, "hop": 480, "win": 1920, "n_mels": 80, "fmin": 0, "fmax": cfg.sample_rate // 2,
            "sample_rate": cfg.sample_rate, "center": False,
        },
        "samples_per_frame": cfg.sample_rate // (cfg.token_frame_rate * cfg.token_mel_ratio),
        "max_prompt_seconds": 30,
        "noise_frames": noise_frames,
    }


def config_section(cfg: ModelConfig, hift_cfg: HiftConfig) -> dict[str, Any]:
    llm, flow = cfg.llm, cfg.flow
    return {
        "sample_rate": cfg.sample_rate,
        "token_frame_rate": cfg.token_frame_rate,
        "llm": {
            "hidden_size": llm.hidden_size, "num_layers": llm.num_layers, "num_heads": llm.num_heads,
            "num_kv_heads": llm.num_kv_heads, "head_dim": llm.head_dim,
            "intermediate_size": llm.intermediate_size, "rope_theta": llm.rope_theta,
            "rms_norm_eps": llm.rms_norm_eps, "text_vocab_size": llm.text_vocab_size,
            "speech_token_size": llm.speech_token_size, "speech_vocab_size": llm.speech_vocab_size,
        },
        "flow": {
            "mel_dim": flow.output_size, "spk_embed_dim": flow.spk_embed_dim, "vocab_size": flow.vocab_size,
            "pre_lookahead_len": flow.pre_lookahead_len, "token_mel_ratio": flow.token_mel_ratio,
            "dit_dim": flow.dit.dim, "dit_depth": flow.dit.depth, "dit_heads": flow.dit.heads,
            "dit_dim_head": flow.dit.dim_head, "static_chunk_size": flow.dit.static_chunk_size,
        },
        "hift": hift_cfg.manifest_config(),
    }


def _frontend_entry(dst: Path, name: str) -> dict[str, Any]:
    inputs, outputs = graph_io(dst / name)
    return {"inputs": inputs, "outputs": outputs, "variants": {"fp32": {**file_entry(dst, name), "data": None}},
            "trt_profile": {}, "batching": "none"}


def export_model(src: Path | str, dst: Path | str, options: ExportOptions | None = None) -> dict[str, Any]:
    """Export `src` (official layout) into `dst`; returns the manifest."""
    opts = options or ExportOptions()
    src, dst = Path(src), Path(dst)
    for p in opts.precisions:
        if p not in PRECISIONS:
            raise ExportError(f"precision {p!r} is not supported; choose from {', '.join(PRECISIONS)}")
    if "fp32" not in opts.precisions:
        raise ExportError("the fp32 variant is always exported (it is the reference every other variant is checked against)")
    if not 1 <= opts.noise_frames <= NOISE_FRAMES:
        raise ExportError(f"noise_frames must be in [1, {NOISE_FRAMES}], got {opts.noise_frames}")
    check_source(src)
    cfg = load_model_config(src)
    hift_cfg = HiftConfig.from_yaml(cfg.hift_raw)

    work = dst.parent / (dst.name + ".partial")
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    try:
        manifest = _export_into(src, work, cfg, hift_cfg, opts)
        if dst.exists():
            shutil.rmtree(dst)
        work.rename(dst)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return manifest


def _timed(opts: ExportOptions, name: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    out = fn()
    opts.timings[name] = time.perf_counter() - start
    opts.log(f"  {name}: {opts.timings[name]:.1f} s")
    return out


def _export_into(src: Path, dst: Path, cfg: ModelConfig, hift_cfg: HiftConfig, opts: ExportOptions) -> dict[str, Any]:
    log = opts.log
    log(f"export {src} -> {dst.with_suffix('')}")
    llm = _timed(opts, "load llm.pt", lambda: load_llm(src, cfg.llm))
    flow = _timed(opts, "load flow.pt", lambda: load_flow(src, cfg.flow))
    hift = _timed(opts, "load hift.pt", lambda: load_hift(src / "hift.pt", hift_cfg))
    want16 = "fp16" in opts.precisions
    want8 = "int8" in opts.precisions

    def add_int8(stage: str, variants: dict[str, str]) -> None:
        # Dynamic int8 of the weight MatMuls, made from the fp32 graph just written.
        if want8 and stage in INT8_STAGES:
            name = f"{stage}.int8.onnx"
            _timed(opts, f"{stage} int8", lambda: quantize_int8(dst / variants["fp32"], dst / name))
            variants["int8"] = name
    graphs: dict[str, Any] = {}

    # LLM
    _timed(opts, "export llm", lambda: export_llm(llm, dst / "llm.fp32.onnx", OPSET))
    variants = {"fp32": "llm.fp32.onnx"}
    if want16:
        _timed(opts, "llm fp16", lambda: export_llm_fp16(llm, dst / "llm.fp16.onnx", OPSET))
        variants["fp16"] = "llm.fp16.onnx"
    add_int8("llm", variants)
    llm_entry = llm_graph_entry(cfg.llm)
    graphs["llm"] = graph_entry(dst, variants, llm_entry["trt_profile"], batching=llm_entry["batching"])
    # The fixed-shape step over a slot cache written in place (fp32 only for now: the fp16
    # variant is future work; the runtime serves an fp16 request with the fp32 graph).
    step_entry = _timed(opts, "export llm_step", lambda: export_llm_step(llm, dst / "llm_step.fp32.onnx", OPSET))
    graphs["llm_step"] = graph_entry(dst, {"fp32": "llm_step.fp32.onnx"}, step_entry["trt_profile"], batching=step_entry["batching"])

    # Flow front
    front = _timed(opts, "export flow_front", lambda: export_flow_front(flow, dst / "flow_front.fp32.onnx", OPSET))
    # fp32 only: two small convolutions and a table look-up per call (negligible next to the DiT),
    # and an exact token embedding keeps every precision variant of the DiT on the same inputs.
    # The runtime serves an fp16 request for this stage with the fp32 graph and says so.
    variants = {"fp32": "flow_front.fp32.onnx"}
    graphs["flow_front"] = graph_entry(dst, variants, front.get("trt_profile"))

    # DiT: fp16 is the mixed variant (LayerNorm, softmax, residual stream in fp32; cosyvoice3.md §5.9).
    dit = _timed(opts, "export dit", lambda: export_dit(flow.dit, dst / "dit.fp32.onnx", OPSET))
    variants = {"fp32": "dit.fp32.onnx"}
    if want16:
        _timed(opts, "dit fp16-mixed", lambda: make_dit_mixed_fp16(dst / "dit.fp32.onnx", dst / "dit.fp16.onnx"))
        variants["fp16"] = "dit.fp16.onnx"
    add_int8("dit", variants)
    # Rows of different lengths share a call right-padded, `mask` 0 on the padding: the
    # positional convolution is causal and attention ignores masked keys, so a padded row's
    # valid frames are computed as alone (docs/model-format.md).
    graphs["dit"] = graph_entry(dst, variants, dit.get("trt_profile"), batching="padded_frames")

    # HiFT decode (f0 and source run natively in the runtime from side.safetensors)
    hd = _timed(opts, "export hift_decode", lambda: export_hift_decode(hift, dst / "hift_decode.fp32.onnx", OPSET))
    variants = {"fp32": "hift_decode.fp32.onnx"}
    if want16:
        _timed(opts, "hift_decode fp16", lambda: make_hift_decode_fp16(dst / "hift_decode.fp32.onnx", dst / "hift_decode.fp16.onnx"))
        variants["fp16"] = "hift_decode.fp16.onnx"
    graphs["hift_decode"] = graph_entry(dst, variants, hd.get("trt_profile"))

    # Frontend graphs, copied as given.
    for stage, name in (("campplus", "campplus.onnx"), ("speech_tokenizer", "speech_tokenizer_v3.onnx")):
        shutil.copyfile(src / name, dst / name)
        graphs[stage] = _frontend_entry(dst, name)

    # Tokenizer and side tensors.
    tok = _timed(opts, "tokenizer.json", lambda: build_tokenizer_json(src / "CosyVoice-BlankEN", dst / "tokenizer.json"))
    table = llm.backbone.embed_tokens.weight.detach().float().numpy()
    side: dict[str, np.ndarray] = {}
    if opts.sparse_text_embedding:
        ids = reachable_text_ids(tok, table.shape[0])
        side["llm.text_embedding_ids"] = ids
        table = table[ids]
    side.update({
        "llm.text_embedding": np.ascontiguousarray(table),
        "llm.speech_embedding": llm.speech_embedding.weight.detach().float().numpy(),
        "flow.noise": np.ascontiguousarray(flow_noise()[:, : opts.noise_frames].numpy()),
    })
    side.update(hift_side_tensors(hift))
    _timed(opts, "side.safetensors", lambda: save_file(side, str(dst / "side.safetensors"), metadata={"format": "cosy-side-1"}))

    tn: dict[str, Any] | None = None
    if opts.text_normalization:
        from .tn_assets import copy_tn_assets

        tn = _timed(opts, "tn grammars", lambda: copy_tn_assets(dst))["tn"]

    offset = sine_noise_offset(cfg)
    first = sine_noise(offset, 1)[0].tolist()
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "exporter": {
            "version": __version__,
            "torch": torch.__version__.split("+")[0],
            "onnx_opset": OPSET,
            "created": _created_stamp(opts),
        },
        "source": {"yaml_sha256": sha256_file(src / "cosyvoice3.yaml"), "random": opts.random},
        "config": config_section(cfg, hift_cfg),
        "constants": constants(cfg, opts.noise_frames),
        "graphs": graphs,
        "files": {"tokenizer": file_entry(dst, "tokenizer.json"), "side": file_entry(dst, "side.safetensors")},
        "tn": tn,
        "sine_noise": {"generator": "mt19937", "seed": 0, "offset": offset, "shape": [7_200_000, 9], "first": first},
    }
    if tn is not None:
        for lang in ("zh", "en"):
            for role, rel in tn[lang].items():
                manifest["files"][f"tn.{lang}.{role}"] = file_entry(dst, rel)
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    log(f"wrote {len(graphs)} graphs, manifest format {FORMAT} v{FORMAT_VERSION}")
    return manifest


def _created_stamp(opts: ExportOptions) -> str:
    # A random (fixture) export records no time, so regenerating it is bit-for-bit reproducible.
    if opts.random is not None:
        return "random"
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def add_llm_step(src: Path | str, dst: Path | str, opset: int = OPSET) -> dict[str, Any]:
    """Adds the `llm_step` graph to a folder exported before it existed: exports it from the
    checkpoint folder `src` (the one `dst` was exported from) into `dst` and adds its
    `graphs.llm_step` entry to `dst/manifest.json`, leaving every other file and entry as it is.
    Returns the entry."""
    src, dst = Path(src), Path(dst)
    manifest_path = dst / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    cfg = load_model_config(src)
    llm = load_llm(src, cfg.llm)
    entry = export_llm_step(llm, dst / "llm_step.fp32.onnx", opset)
    graph = graph_entry(dst, {"fp32": "llm_step.fp32.onnx"}, entry["trt_profile"], batching=entry["batching"])
    manifest["graphs"]["llm_step"] = graph
    manifest_path.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return graph


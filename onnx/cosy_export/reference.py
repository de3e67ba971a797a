"""Eager PyTorch reference pipeline: the official CosyVoice3 inference algorithm on our own modules.

It reads the *official* checkpoint folder (not the exported one) and follows cosyvoice3.md §3-§7:
zero-shot prompt features, LLM decoding with RAS sampling (greedy when top_k = 1), silent-token
pruning, flow (offline, or the official streaming schedule), HiFT. It can dump every intermediate
with the names `compare.py` and the Rust `--dump` use, so it serves as the parity reference for the
runtime and as the PyTorch side of the speed comparison.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnxruntime as ort
import torch

from .features import align_prompt, prompt_features
from .flow import CosyFlow, flow_inference, load_flow
from .hift import HiftConfig, HiftGenerator, load_hift
from .llm import CosyLlm, load_llm
from .noise import flow_noise, sine_noise, sine_noise_offset
from .tokenizer import build_tokenizer, encode
from .yamlcfg import ModelConfig, load_model_config

SILENT_TOKENS = frozenset([1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323])
MAX_SILENT_RUN = 5
ENDOFPROMPT_ID = 151646


def nucleus_candidates(logp: torch.Tensor, top_p: float, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Kept ids and their (unnormalised) probabilities: stable descending sort, keep tokens while
    cum < top_p and count < top_k; the token that crosses top_p is included (§4.3)."""
    prob = logp.softmax(dim=0)
    sorted_prob, sorted_idx = prob.sort(descending=True, stable=True)
    keep_p: list[torch.Tensor] = []
    keep_i: list[torch.Tensor] = []
    cum = 0.0
    for i in range(len(sorted_idx)):
        if cum < top_p and len(keep_p) < top_k:
            cum += float(sorted_prob[i])
            keep_p.append(sorted_prob[i])
            keep_i.append(sorted_idx[i])
        else:
            break
    return torch.stack(keep_i), torch.stack(keep_p)


def ras_sample(
    logp: torch.Tensor,
    decoded: list[int],
    sampling: dict[str, Any],
    gen: torch.Generator,
) -> int:
    """Repetition-aware sampling (official `ras_sampling`, cosyvoice3.md §4.3)."""
    ids, probs = nucleus_candidates(logp, float(sampling["top_p"]), int(sampling["top_k"]))
    top = int(ids[torch.multinomial(probs, 1, replacement=True, generator=gen)])
    win = int(sampling["win_size"])
    rep = sum(1 for t in decoded[-win:] if t == top)
    if rep >= win * float(sampling["tau_r"]):
        masked = logp.clone()
        masked[top] = float("-inf")
        top = int(torch.multinomial(masked.softmax(dim=0), 1, replacement=True, generator=gen))
    return top


@torch.no_grad()
def decode_llm(
    llm: CosyLlm,
    lm_input: torch.Tensor,
    n_tts_text_tokens: int,
    sampling: dict[str, Any],
    seed: int = 0,
    ignore_stop_until: int | None = None,
    on_token: Callable[[int], None] | None = None,
) -> tuple[list[int], int | None, str]:
    """Official decoding loop (§4.2). Returns (tokens, stop id or None, termination).

    `ignore_stop_until` is a benchmark/test-only option (not the official behaviour): exactly that
    many tokens are decoded, every stop id masked, so random-weight models produce a known amount
    of speech, the same on both sides of a comparison (the runtime's `--min-tokens`). `on_token`
    sees each speech token as it is sampled (the live streaming loop's shared token list).
    """
    cfg = llm.cfg
    gen = torch.Generator().manual_seed(seed)
    min_len = int(n_tts_text_tokens * 2)
    max_len = int(n_tts_text_tokens * 20)
    if ignore_stop_until is not None:
        max_len = ignore_stop_until
    cache = llm.empty_cache()
    x = lm_input
    out: list[int] = []
    for i in range(max_len):
        logits, cache = llm.forward_step(x, cache)
        logp = logits[0].float().log_softmax(dim=-1)
        if i < min_len:
            # Official quirk: masks index speech_token_size (= sos), not eos.
            logp[cfg.speech_token_size] = float("-inf")
        if ignore_stop_until is not None:
            logp[cfg.speech_token_size : cfg.speech_vocab_size] = float("-inf")
        top = ras_sample(logp, out, sampling, gen)
        if cfg.speech_token_size <= top < cfg.speech_vocab_size:
            return out, top, "stop_token"
        out.append(top)
        if on_token is not None:
            on_token(top)
        x = llm.speech_embedding.weight[top].reshape(1, 1, -1)
    return out, None, "max_len"


def prune_silent(tokens: list[int]) -> list[int]:
    """Drop silent tokens once more than MAX_SILENT_RUN occur in a row (§4.4)."""
    kept: list[int] = []
    run = 0
    for t in tokens:
        if t in SILENT_TOKENS:
            run += 1
            if run > MAX_SILENT_RUN:
                continue
        else:
            run = 0
        kept.append(t)
    return kept


@dataclass
class ReferenceModel:
    """The official folder loaded into our own modules plus the two frontend ONNX sessions."""

    model_dir: Path
    cfg: ModelConfig
    llm: CosyLlm
    flow: CosyFlow
    hift: HiftGenerator
    tokenizer: Any
    campplus: ort.InferenceSession
    speech_tokenizer: ort.InferenceSession
    flow_noise: torch.Tensor
    sine_noise_offset: int
    _sine_cache: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def load(cls, model_dir: Path | str) -> "ReferenceModel":
        model_dir = Path(model_dir)
        cfg = load_model_config(model_dir)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        return cls(
            model_dir=model_dir,
            cfg=cfg,
            llm=load_llm(model_dir, cfg.llm),
            flow=load_flow(model_dir, cfg.flow),
            hift=load_hift(model_dir / "hift.pt", HiftConfig.from_yaml(cfg.hift_raw)),
            tokenizer=build_tokenizer(model_dir / "CosyVoice-BlankEN"),
            campplus=ort.InferenceSession(str(model_dir / "campplus.onnx"), opts, providers=["CPUExecutionProvider"]),
            speech_tokenizer=ort.InferenceSession(
                str(model_dir / "speech_tokenizer_v3.onnx"), opts, providers=["CPUExecutionProvider"]
            ),
            flow_noise=flow_noise().unsqueeze(0),
            sine_noise_offset=sine_noise_offset(cfg),
        )

    def sine_noise(self, samples: int) -> torch.Tensor:
        """Uniform noise rows [1, samples, 9]; drawn once for the longest request seen."""
        have = next(iter(self._sine_cache.values()), None)
        if have is None or have.shape[1] < samples:
            rows = max(samples, 24000 * 30)
            self._sine_cache = {rows: sine_noise(self.sine_noise_offset, rows).unsqueeze(0)}
            have = self._sine_cache[rows]
        return have[:, :samples]


@dataclass
class Request:
    tts_text: str
    prompt_text: str
    prompt_wav: Path
    stream: bool = False
    seed: int = 0
    ignore_stop_until: int | None = None
    # Streaming only: run as the official `tts()` does (cosyvoice3.md §7.2), the LLM in a thread
    # and the main thread polling every 0.1 s, so `first_audio` is what users of the official code
    # wait; otherwise the chunks run after the LLM (same outputs: the schedule depends only on
    # token counts).
    live: bool = False


def _frontend(model: ReferenceModel, req: Request, dump: dict[str, np.ndarray]) -> dict[str, Any]:
    feats = prompt_features(req.prompt_wav)
    mel = feats.whisper_mel[None].astype(np.float32)
    tok_in = {i.name: None for i in model.speech_tokenizer.get_inputs()}
    names = list(tok_in)
    raw = model.speech_tokenizer.run(
        None, {names[0]: mel, names[1]: np.array([mel.shape[2]], dtype=np.int32)}
    )[0].reshape(-1).astype(np.int64)
    fbank = feats.campplus_fbank.astype(np.float32)
    emb = model.campplus.run(None, {model.campplus.get_inputs()[0].name: fbank[None]})[0].reshape(1, -1)
    speech_tokens, prompt_feat = align_prompt(raw, feats.prompt_feat_raw)
    text = encode(model.tokenizer, req.tts_text)
    prompt_text = encode(model.tokenizer, req.prompt_text)
    if ENDOFPROMPT_ID not in prompt_text + text:
        raise ValueError("<|endofprompt|> (151646) must appear in the prompt text or the text (CosyVoice3 requirement)")
    dump.update(
        text_token=np.array(text, dtype=np.int32),
        prompt_text_token=np.array(prompt_text, dtype=np.int32),
        whisper_mel=feats.whisper_mel.astype(np.float32),
        prompt_speech_token_raw=raw.astype(np.int32),
        prompt_speech_token=speech_tokens.astype(np.int32),
        campplus_fbank=fbank,
        speaker_embedding=emb[0].astype(np.float32),
        prompt_feat_raw=feats.prompt_feat_raw.astype(np.float32),
        prompt_feat=prompt_feat.astype(np.float32),
    )
    return {
        "text": text,
        "prompt_text": prompt_text,
        "speech_tokens": torch.from_numpy(speech_tokens.astype(np.int64)),
        "prompt_feat": torch.from_numpy(prompt_feat.astype(np.float32)).unsqueeze(0),
        "embedding": torch.from_numpy(emb.astype(np.float32)),
    }


@torch.no_grad()
def synthesize(model: ReferenceModel, req: Request, timings: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """One zero-shot utterance (text frontend off). Returns the dump dict (waveform included)."""
    timings = timings if timings is not None else {}
    dump: dict[str, np.ndarray] = {}
    t0 = time.perf_counter()
    fe = _frontend(model, req, dump)
    timings["frontend"] = time.perf_counter() - t0

    lm_input = model.llm.build_lm_input(torch.tensor(fe["prompt_text"] + fe["text"]), fe["speech_tokens"])
    if req.stream and req.live:
        _synthesize_live(model, req, fe, lm_input, dump, timings)
        timings["first_audio"] += timings["frontend"]
        return dump
    t0 = time.perf_counter()
    raw_tokens, _, _ = decode_llm(
        model.llm, lm_input, len(fe["text"]), model.cfg.llm.sampling or {}, req.seed, req.ignore_stop_until
    )
    timings["llm"] = time.perf_counter() - t0
    tokens = prune_silent(raw_tokens)
    dump["llm_token_raw"] = np.array(raw_tokens, dtype=np.int32)
    dump["speech_token"] = np.array(tokens, dtype=np.int32)

    t0 = time.perf_counter()
    if req.stream:
        _token2wav_stream(model, fe, tokens, dump, timings)
    else:
        _token2wav_offline(model, fe, tokens, dump, timings)
    timings["token2wav"] = time.perf_counter() - t0
    return dump


def _flow(model: ReferenceModel, fe: dict[str, Any], tokens: list[int], finalize: bool, streaming: bool) -> dict[str, torch.Tensor]:
    return flow_inference(
        model.flow, model.flow_noise, torch.tensor(tokens, dtype=torch.int64), fe["speech_tokens"],
        fe["prompt_feat"], fe["embedding"], finalize=finalize, streaming=streaming,
    )


def _hift(model: ReferenceModel, mel: torch.Tensor, finalize: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    noise = model.sine_noise(mel.shape[2] * model.hift.cfg.samples_per_frame)
    return model.hift.inference(mel, noise, finalize=finalize)


def _token2wav_offline(model: ReferenceModel, fe: dict[str, Any], tokens: list[int], dump: dict[str, np.ndarray],
                       timings: dict[str, float]) -> None:
    t0 = time.perf_counter()
    out = _flow(model, fe, tokens, finalize=True, streaming=False)
    timings["flow"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    wav, src, f0 = _hift(model, out["mel"], finalize=True)
    timings["hift"] = time.perf_counter() - t0
    dump.update(
        flow_mu=out["mu"][0].numpy(), flow_cond=out["cond"][0].numpy(), flow_mel=out["mel"][0].numpy(),
        hift_f0=f0[0].float().numpy(), hift_source=src[0, 0].numpy(), waveform=wav[0].numpy(),
    )


def stream_schedule(n_tokens: int, n_prompt: int, hop: int = 25, max_hop: int = 100, lookahead: int = 3) -> list[tuple[int, bool]]:
    """Flow calls of the official streaming loop once all `n_tokens` are known: (token count used,
    finalize). Chunk boundaries depend only on token counts (cosyvoice3.md §7.2), so the schedule
    is the same as when tokens arrive one by one."""
    pad = -(-n_prompt // hop) * hop - n_prompt
    calls: list[tuple[int, bool]] = []
    offset = 0
    hop_len = hop
    first = True
    while True:
        this_hop = hop_len + pad if first else hop_len
        if n_tokens - offset >= this_hop + lookahead:
            calls.append((offset + this_hop + lookahead, False))
            offset += this_hop
            hop_len = min(max_hop, hop_len * 2)
            first = False
        else:
            break
    calls.append((n_tokens, True))
    return calls


def _token2wav_stream(model: ReferenceModel, fe: dict[str, Any], tokens: list[int], dump: dict[str, np.ndarray],
                      timings: dict[str, float]) -> None:
    ratio = model.cfg.token_mel_ratio
    n_prompt = int(fe["speech_tokens"].numel())
    mel_acc: torch.Tensor | None = None
    chunks: list[np.ndarray] = []
    speech_offset = 0
    token_offset = 0
    flow_t = hift_t = 0.0
    for used, finalize in stream_schedule(len(tokens), n_prompt):
        t0 = time.perf_counter()
        out = _flow(model, fe, tokens[:used], finalize=finalize, streaming=not finalize)
        new_mel = out["mel"][:, :, token_offset * ratio:]
        flow_t += time.perf_counter() - t0
        mel_acc = new_mel if mel_acc is None else torch.cat([mel_acc, new_mel], dim=2)
        t0 = time.perf_counter()
        wav, src, f0 = _hift(model, mel_acc, finalize=finalize)
        hift_t += time.perf_counter() - t0
        chunks.append(wav[0, speech_offset:].numpy())
        speech_offset += chunks[-1].shape[0]
        if not finalize:
            token_offset = used - 3
    assert mel_acc is not None
    timings["flow"], timings["hift"] = flow_t, hift_t
    dump.update(
        flow_mel=mel_acc[0].numpy(), hift_f0=f0[0].float().numpy(), hift_source=src[0, 0].numpy(),
        waveform=np.concatenate(chunks), chunk_samples=np.array([c.shape[0] for c in chunks], dtype=np.int64),
    )


class _LiveChunks:
    """The streaming chunks' flow + HiFT state (official `token2wav` with its per-request cache)."""

    def __init__(self, model: ReferenceModel, fe: dict[str, Any]) -> None:
        self.model, self.fe = model, fe
        self.mel_acc: torch.Tensor | None = None
        self.chunks: list[np.ndarray] = []
        self.speech_offset = 0
        self.flow_s = self.hift_s = 0.0
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None

    def run(self, tokens: list[int], token_offset: int, finalize: bool) -> None:
        ratio = self.model.cfg.token_mel_ratio
        t0 = time.perf_counter()
        out = _flow(self.model, self.fe, tokens, finalize=finalize, streaming=not finalize)
        new_mel = out["mel"][:, :, token_offset * ratio:]
        self.flow_s += time.perf_counter() - t0
        self.mel_acc = new_mel if self.mel_acc is None else torch.cat([self.mel_acc, new_mel], dim=2)
        t0 = time.perf_counter()
        wav, src, f0 = _hift(self.model, self.mel_acc, finalize=finalize)
        self.hift_s += time.perf_counter() - t0
        self.chunks.append(wav[0, self.speech_offset:].numpy())
        self.speech_offset += self.chunks[-1].shape[0]
        self.last = (src, f0)


def _synthesize_live(model: ReferenceModel, req: Request, fe: dict[str, Any], lm_input: torch.Tensor,
                     dump: dict[str, np.ndarray], timings: dict[str, float]) -> None:
    """The official streaming `tts()` loop (cosyvoice3.md §7.2): `llm_job` in a thread appends the
    speech tokens (silent runs pruned, §4.4) to a shared list; this thread sleeps 0.1 s per
    iteration and runs a chunk whenever hop + 3 tokens past the offset are there; after the LLM
    ends, one final chunk. `timings["first_audio"]` is when the first chunk's audio exists."""
    started = time.perf_counter()
    tokens: list[int] = []
    raw: list[int] = []
    silent_run = [0]
    llm_end = threading.Event()
    failure: list[BaseException] = []

    def on_token(t: int) -> None:
        raw.append(t)
        if t in SILENT_TOKENS:
            silent_run[0] += 1
            if silent_run[0] > MAX_SILENT_RUN:
                return
        else:
            silent_run[0] = 0
        tokens.append(t)

    def llm_job() -> None:
        try:
            with torch.no_grad():
                decode_llm(model.llm, lm_input, len(fe["text"]), model.cfg.llm.sampling or {}, req.seed,
                           req.ignore_stop_until, on_token)
        except BaseException as e:  # reported on the main thread
            failure.append(e)
        finally:
            timings["llm"] = time.perf_counter() - started
            llm_end.set()

    thread = threading.Thread(target=llm_job, name="llm_job")
    thread.start()
    n_prompt = int(fe["speech_tokens"].numel())
    hop, max_hop, lookahead = 25, 100, 3
    pad = -(-n_prompt // hop) * hop - n_prompt
    chunks = _LiveChunks(model, fe)
    token_offset, hop_len, first = 0, hop, True
    while True:
        time.sleep(0.1)
        this_hop = hop_len + pad if first else hop_len
        if len(tokens) - token_offset >= this_hop + lookahead:
            chunks.run(tokens[: token_offset + this_hop + lookahead], token_offset, finalize=False)
            if first:
                timings["first_audio"] = time.perf_counter() - started
            token_offset += this_hop
            hop_len = min(max_hop, hop_len * 2)
            first = False
        if llm_end.is_set() and len(tokens) - token_offset < this_hop + lookahead:
            break
    thread.join()
    if failure:
        raise failure[0]
    chunks.run(list(tokens), token_offset, finalize=True)
    if first:
        timings["first_audio"] = time.perf_counter() - started
    assert chunks.mel_acc is not None and chunks.last is not None
    src, f0 = chunks.last
    timings["flow"], timings["hift"] = chunks.flow_s, chunks.hift_s
    timings["token2wav"] = chunks.flow_s + chunks.hift_s
    dump["llm_token_raw"] = np.array(raw, dtype=np.int32)
    dump["speech_token"] = np.array(tokens, dtype=np.int32)
    dump.update(
        flow_mel=chunks.mel_acc[0].numpy(), hift_f0=f0[0].float().numpy(), hift_source=src[0, 0].numpy(),
        waveform=np.concatenate(chunks.chunks),
        chunk_samples=np.array([c.shape[0] for c in chunks.chunks], dtype=np.int64),
    )


def write_dump(dump: dict[str, np.ndarray], out_dir: Path | str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, arr in dump.items():
        np.save(out / f"{name}.npy", arr)


def run_case(model: ReferenceModel, case_dir: Path, reference_root: Path, out_dir: Path) -> dict[str, float]:
    """Run one golden case (its meta.json gives the inputs) and dump into out_dir."""
    meta = json.loads((case_dir / "meta.json").read_text())
    req = Request(
        tts_text=meta["tts_text"], prompt_text=meta["prompt_text"],
        prompt_wav=reference_root / meta["prompt_wav"], stream=bool(meta["stream"]),
    )
    timings: dict[str, float] = {}
    write_dump(synthesize(model, req, timings), out_dir)
    return timings

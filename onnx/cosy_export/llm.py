"""The CosyVoice3 LLM as our own PyTorch module (Qwen2 backbone + speech embedding/head) and its
ONNX export (docs/model-format.md, graph `llm`).

Facts from cosyvoice3.md §2.2, §4.1-4.2, Appendix C:
* Qwen2 decoder layers: RMSNorm -> GQA attention (q/k/v with bias, o_proj without) with RoPE
  (HF `rotate_half`: the two halves of each head are paired) -> residual -> RMSNorm -> SiLU-gated MLP.
* The head is `llm_decoder` (no bias) over the final-normed hidden state of the last position.
* sos and task_id are rows 6561 and 6563 of `speech_embedding`; text goes through Qwen's
  `embed_tokens`.

Module names mirror `llm.pt` exactly (`llm.model.model.layers.N...`), so the file loads strictly;
the tied, unused `llm.model.lm_head.weight` is accepted and ignored.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import check_dims, load_state_dict, match_state_dict, tensor_shape
from .constants import rope_inverse_frequencies
from .yamlcfg import LlmConfig, load_model_config

LM_HEAD_KEY = "llm.model.lm_head.weight"
KvCache = list[tuple[Tensor, Tensor]]
#: How one layer's new keys/values join its cache: (k_new, v_new) -> (k_attend, v_attend, k_out,
#: v_out); the padded graph `llm` concatenates, the slot graph `llm_step` scatters in place.
KvExtend = Callable[[Tensor, Tensor], tuple[Tensor, Tensor, Tensor, Tensor]]


class RmsNorm(nn.Module):
    """Qwen2 RMSNorm: x / sqrt(mean(x²) + eps) in float32, times a learned scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class QwenAttention(nn.Module):
    def __init__(self, cfg: LlmConfig) -> None:
        super().__init__()
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=True)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=True)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=True)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor, kv: KvExtend) -> tuple[Tensor, Tensor, Tensor]:
        """x [b, s, hidden]; `kv(k_new, v_new)` (both [b, kv_heads, s, head_dim], roped) returns
        the keys/values to attend over ([b, kv_heads, total, head_dim]) and the cache to hand back
        (graph `llm`: the grown copy; graph `llm_step`: the slot buffers written in place);
        `allowed` [b, 1, s, total] says which columns each query sees."""
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k_all, v_all, k_out, v_out = kv(k, v)
        # GQA: query head h reads kv head h // groups (HF repeat_kv). The `groups` query heads of
        # one kv head are stacked along the sequence axis instead of copying K and V per query
        # head: the same dot products, without two [batch, heads, past+seq, head_dim] copies per
        # layer and step (the bulk of a batched decode step's memory traffic after the weights).
        groups = self.num_heads // self.num_kv_heads
        total = k_all.shape[2]
        qg = q.reshape(b, self.num_kv_heads, groups * s, self.head_dim)
        scores = torch.matmul(qg, k_all.transpose(2, 3)) * (self.head_dim**-0.5)  # [b, kv, groups·s, total]
        scores = scores.view(b, self.num_kv_heads, groups, s, total).masked_fill(~allowed.unsqueeze(2), float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).view(b, self.num_kv_heads, groups * s, total)
        out = torch.matmul(probs, v_all).view(b, self.num_heads, s, self.head_dim)
        out = out.transpose(1, 2).reshape(b, s, self.num_heads * self.head_dim)
        return self.o_proj(out), k_out, v_out


class QwenMlp(nn.Module):
    def __init__(self, cfg: LlmConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class QwenLayer(nn.Module):
    def __init__(self, cfg: LlmConfig) -> None:
        super().__init__()
        self.self_attn = QwenAttention(cfg)
        self.mlp = QwenMlp(cfg)
        self.input_layernorm = RmsNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RmsNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, allowed: Tensor, kv: KvExtend) -> tuple[Tensor, Tensor, Tensor]:
        attn, k, v = self.self_attn(self.input_layernorm(x), cos, sin, allowed, kv)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k, v


class QwenBackbone(nn.Module):
    """`Qwen2Model`: embed_tokens, layers, final norm (keys under `llm.model.model.`)."""

    def __init__(self, cfg: LlmConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.text_vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(QwenLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RmsNorm(cfg.hidden_size, cfg.rms_norm_eps)


class _QwenCausalLm(nn.Module):
    """Stands for HF `Qwen2ForCausalLM` (`.model`); its tied lm_head is never used."""

    def __init__(self, cfg: LlmConfig) -> None:
        super().__init__()
        self.model = QwenBackbone(cfg)


class _QwenEncoder(nn.Module):
    """Stands for the official `Qwen2Encoder` wrapper (`.model`)."""

    def __init__(self, cfg: LlmConfig) -> None:
        super().__init__()
        self.model = _QwenCausalLm(cfg)


class CosyLlm(nn.Module):
    """CosyVoice3LM for inference: backbone + `speech_embedding` + `llm_decoder`."""

    def __init__(self, cfg: LlmConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.llm = _QwenEncoder(cfg)
        self.speech_embedding = nn.Embedding(cfg.speech_vocab_size, cfg.hidden_size)
        self.llm_decoder = nn.Linear(cfg.hidden_size, cfg.speech_vocab_size, bias=False)
        inv_freq = rope_inverse_frequencies(cfg.head_dim, cfg.rope_theta)  # Qwen2's, the same on every CPU
        self.register_buffer("rope_inv_freq", inv_freq, persistent=False)

    @property
    def backbone(self) -> QwenBackbone:
        return self.llm.model.model

    def empty_cache(self, dtype: torch.dtype = torch.float32) -> KvCache:
        shape = (1, self.cfg.num_kv_heads, 0, self.cfg.head_dim)
        return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(self.cfg.num_layers)]

    def forward_step(self, inputs_embeds: Tensor, past_kv: KvCache) -> tuple[Tensor, KvCache]:
        """One prefill or decode step of one sequence. inputs_embeds [1, seq, hidden]; past_kv per
        layer ([1, kv_heads, past, head_dim] ×2). Returns logits of the last position [1, vocab] and
        the grown cache. Positions are past..past+seq-1; causal over new positions, full over the past."""
        seq = inputs_embeds.shape[1]
        past = past_kv[0][0].shape[2]
        mask = torch.ones(1, past + seq, dtype=torch.int64)
        positions = (torch.arange(seq, dtype=torch.int64) + past).unsqueeze(0)
        return self.forward_batched(inputs_embeds, mask, positions, past_kv)

    def forward_batched(
        self, inputs_embeds: Tensor, attention_mask: Tensor, position_ids: Tensor, past_kv: KvCache
    ) -> tuple[Tensor, KvCache]:
        """One step of B sequences in one padded KV layout (docs/model-format.md, graph `llm`).

        inputs_embeds [B, seq, hidden]; attention_mask [B, past + seq] (1 = a real position,
        0 = padding); position_ids [B, seq] (each row's own RoPE positions); past_kv per layer
        [B, kv_heads, past, head_dim] ×2. The new positions occupy columns past..past+seq-1 of
        every row, so rows of different lengths are left-padded: their padding columns are
        masked, and each query always sees its own column (a padded query then attends only to
        itself instead of to nothing, which would be NaN). Returns the logits of column
        past+seq-1 of every row [B, vocab] and the grown cache [B, kv_heads, past+seq, head_dim]."""
        seq = inputs_embeds.shape[1]
        past = past_kv[0][0].shape[2]
        q_col = torch.arange(seq, dtype=torch.int64) + past
        k_col = torch.arange(seq + past, dtype=torch.int64)
        causal = k_col.unsqueeze(0) <= q_col.unsqueeze(1)  # [seq, past+seq]
        own = k_col.unsqueeze(0) == q_col.unsqueeze(1)
        keys = attention_mask > 0  # [B, past+seq]
        allowed = ((causal.unsqueeze(0) & keys.unsqueeze(1)) | own.unsqueeze(0)).unsqueeze(1)  # [B, 1, seq, past+seq]
        extends = [_concat_kv(pk, pv) for pk, pv in past_kv]
        return self._run_layers(inputs_embeds, position_ids, allowed, extends)

    def _rope(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = position_ids.to(torch.float32).unsqueeze(-1) * self.rope_inv_freq  # [B, seq, head_dim/2]
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)  # [B, 1, seq, head_dim]
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def _run_layers(
        self, inputs_embeds: Tensor, position_ids: Tensor, allowed: Tensor, extends: list[KvExtend]
    ) -> tuple[Tensor, KvCache]:
        """The decoder stack shared by both graphs: RoPE at `position_ids`, every layer with its
        own cache update, final norm and head over the last position of every row."""
        cos, sin = self._rope(position_ids, inputs_embeds.dtype)
        h = inputs_embeds
        present: KvCache = []
        for layer, extend in zip(self.backbone.layers, extends):
            h, k, v = layer(h, cos, sin, allowed, extend)
            present.append((k, v))
        last = self.backbone.norm(h[:, -1, :])
        return self.llm_decoder(last), present

    def forward_slots(self, inputs_embeds: Tensor, slots: Tensor, start: Tensor, cache: KvCache) -> tuple[Tensor, KvCache]:
        """One step of R rows whose caches live in fixed slot buffers (docs/model-format.md,
        graph `llm_step`).

        inputs_embeds [R, seq, hidden]; slots [R] (the buffer slot of each row); start [R] (the
        positions already in that slot: the RoPE position of the row's first new token); cache
        per layer [num_slots, max_positions, kv_heads, head_dim] ×2, so one (slot, column) is one
        contiguous [kv_heads, head_dim] block. The new keys/values are scattered into columns
        start..start+seq-1 of each row's slot (ScatterND: written in place when the runtime binds
        each output to its input's buffer), then each row attends over its own slot: query j of
        row r sees the columns c <= start[r]+j; every other column is masked before the softmax
        and its values are zeroed, so stale or uninitialised memory (even NaN) cannot reach the
        output. Returns the logits of the last position of every row [R, vocab] and the updated
        buffers."""
        seq = inputs_embeds.shape[1]
        max_positions = cache[0][0].shape[1]
        offsets = torch.arange(seq, dtype=torch.int64)
        positions = start.unsqueeze(1) + offsets  # [R, seq]
        columns = torch.arange(max_positions, dtype=torch.int64)
        allowed = (columns.view(1, 1, max_positions) <= positions.unsqueeze(2)).unsqueeze(1)  # [R, 1, seq, P]
        filled = (columns.unsqueeze(0) <= positions[:, -1:]).view(-1, 1, max_positions, 1)  # [R, 1, P, 1]
        index = torch.stack([slots.unsqueeze(1).expand_as(positions), positions], dim=-1)  # [R, seq, 2]
        extends = [_scatter_kv(ck, cv, index, slots, filled) for ck, cv in cache]
        return self._run_layers(inputs_embeds, positions, allowed, extends)

    def build_lm_input(self, text_tokens: Tensor, prompt_speech_tokens: Tensor) -> Tensor:
        """§4.1: [sos] ++ embed_tokens(text) ++ [task_id] ++ speech_embedding(prompt speech).
        `text_tokens` = prompt text ++ tts text (1-D or [1, n]); returns [1, L, hidden]."""
        text = text_tokens.reshape(-1).to(torch.int64)
        speech = prompt_speech_tokens.reshape(-1).to(torch.int64)
        table = self.speech_embedding.weight
        parts = [
            table[self.cfg.sos].reshape(1, -1),
            self.backbone.embed_tokens(text),
            table[self.cfg.task_id].reshape(1, -1),
            self.speech_embedding(speech),
        ]
        return torch.cat(parts, dim=0).unsqueeze(0)


def _concat_kv(past_k: Tensor, past_v: Tensor) -> KvExtend:
    """Graph `llm`: attend over past ++ new, and hand back that grown copy."""

    def extend(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        k_all = torch.cat([past_k, k], dim=2)
        v_all = torch.cat([past_v, v], dim=2)
        return k_all, v_all, k_all, v_all

    return extend


def _scatter_kv(cache_k: Tensor, cache_v: Tensor, index: Tensor, slots: Tensor, filled: Tensor) -> KvExtend:
    """Graph `llm_step`: write the new columns into the slot buffers (ScatterND at `index`
    [R, seq, 2] = (slot, column)), then read each row's slot back ([R, kv_heads, P, head_dim]);
    values of columns past the row's last new position are zeroed (`filled` [R, 1, P, 1])."""

    def extend(k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        k_out = _scatter_columns(cache_k, index, k)
        v_out = _scatter_columns(cache_v, index, v)
        k_rows = k_out[slots].transpose(1, 2)
        v_rows = torch.where(filled, v_out[slots].transpose(1, 2), torch.zeros((), dtype=v.dtype))
        return k_rows, v_rows, k_out, v_out

    return extend


def _scatter_columns(cache: Tensor, index: Tensor, new: Tensor) -> Tensor:
    """cache [S, P, kv, hd] with new [R, kv, seq, hd] written at index [R, seq, 2] (ScatterND)."""
    return torch.index_put(cache, (index[..., 0], index[..., 1]), new.transpose(1, 2))


def build_lm_input(llm: CosyLlm, text_tokens: Tensor, prompt_speech_tokens: Tensor) -> Tensor:
    return llm.build_lm_input(text_tokens, prompt_speech_tokens)


@torch.no_grad()
def greedy_decode(llm: CosyLlm, lm_input: Tensor, n_tts_text_tokens: int) -> list[int]:
    """Reference greedy decode with the official length rules and `ignore_eos` quirk (§4.2):
    argmax of log_softmax; id 6561 masked while i < min_len; stop on any id in [6561, 6761)."""
    cfg = llm.cfg
    min_len = int(n_tts_text_tokens * 2)
    max_len = int(n_tts_text_tokens * 20)
    cache = llm.empty_cache()
    x = lm_input
    out: list[int] = []
    for i in range(max_len):
        logits, cache = llm.forward_step(x, cache)
        logp = logits[0].log_softmax(dim=-1)
        if i < min_len:
            logp[cfg.speech_token_size] = float("-inf")
        top = int(logp.argmax())
        if cfg.speech_token_size <= top < cfg.speech_vocab_size:
            break
        out.append(top)
        x = llm.speech_embedding.weight[top].reshape(1, 1, -1)
    return out


def check_llm_dims(cfg: LlmConfig, sd: dict[str, Tensor], file: Path | str) -> None:
    """The yaml/config.json numbers must agree with llm.pt before strict loading."""
    emb = tensor_shape(sd, "llm.model.model.embed_tokens.weight", file)
    check_dims("hidden_size", cfg.hidden_size, emb[1], file)
    check_dims("text vocab_size", cfg.text_vocab_size, emb[0], file)
    n_layers = 1 + max(
        (int(k.split(".")[4]) for k in sd if k.startswith("llm.model.model.layers.")), default=-1
    )
    check_dims("num_hidden_layers", cfg.num_layers, n_layers, file)
    kv = tensor_shape(sd, "llm.model.model.layers.0.self_attn.k_proj.weight", file)
    check_dims("num_key_value_heads * head_dim", cfg.num_kv_heads * cfg.head_dim, kv[0], file)
    q = tensor_shape(sd, "llm.model.model.layers.0.self_attn.q_proj.weight", file)
    check_dims("num_attention_heads * head_dim", cfg.num_heads * cfg.head_dim, q[0], file)
    up = tensor_shape(sd, "llm.model.model.layers.0.mlp.up_proj.weight", file)
    check_dims("intermediate_size", cfg.intermediate_size, up[0], file)
    dec = tensor_shape(sd, "llm_decoder.weight", file)
    check_dims("speech vocab (speech_token_size + 200)", cfg.speech_vocab_size, dec[0], file)


def load_llm(model_dir: Path | str, cfg: LlmConfig | None = None) -> CosyLlm:
    """Build CosyLlm from `<model_dir>` (yaml + BlankEN config) and load `llm.pt` strictly."""
    model_dir = Path(model_dir)
    cfg = cfg or load_model_config(model_dir).llm
    path = model_dir / "llm.pt"
    sd = load_state_dict(path)
    check_llm_dims(cfg, sd, path)
    model = CosyLlm(cfg)
    match_state_dict(model, sd, path, unused=[LM_HEAD_KEY])
    return model.eval().requires_grad_(False)


# ----------------------------------------------------------------------------------------------
# ONNX
# ----------------------------------------------------------------------------------------------


class _LlmOnnxWrapper(nn.Module):
    """Flat positional I/O for torch.onnx: inputs_embeds, attention_mask, position_ids, then
    (key, value) per layer."""

    def __init__(self, llm: CosyLlm) -> None:
        super().__init__()
        self.llm = llm

    def forward(self, inputs_embeds: Tensor, attention_mask: Tensor, position_ids: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        cache = [(past[2 * i], past[2 * i + 1]) for i in range(len(past) // 2)]
        logits, present = self.llm.forward_batched(inputs_embeds, attention_mask, position_ids, cache)
        flat: list[Tensor] = [logits]
        for k, v in present:
            flat.extend((k, v))
        return tuple(flat)


#: Inputs before the per-layer cache, in graph order.
LLM_LEAD_INPUTS = ["inputs_embeds", "attention_mask", "position_ids"]

#: What the `llm` graph supports (manifest `graphs.llm.batching`): rows of different lengths in
#: one call, left-padded in a shared KV layout with `attention_mask` and `position_ids`.
LLM_BATCHING = "padded_kv"


def llm_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    inputs = list(LLM_LEAD_INPUTS)
    outputs = ["logits"]
    for i in range(num_layers):
        inputs += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
        outputs += [f"present.{i}.key", f"present.{i}.value"]
    return inputs, outputs


def llm_graph_entry(cfg: LlmConfig, max_seq: int = 4096, max_batch: int = 64) -> dict[str, Any]:
    """The manifest GRAPH entry (without `variants`) for the `llm` graph."""
    kv = lambda name, past: {"name": name, "dtype": "float32", "shape": ["batch", cfg.num_kv_heads, past, cfg.head_dim]}  # noqa: E731
    inputs: list[dict[str, Any]] = [
        {"name": "inputs_embeds", "dtype": "float32", "shape": ["batch", "seq", cfg.hidden_size]},
        {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "past_plus_seq"]},
        {"name": "position_ids", "dtype": "int64", "shape": ["batch", "seq"]},
    ]
    outputs: list[dict[str, Any]] = [{"name": "logits", "dtype": "float32", "shape": ["batch", cfg.speech_vocab_size]}]
    profile: dict[str, Any] = {
        "inputs_embeds": {"min": [1, 1, cfg.hidden_size], "opt": [1, 1, cfg.hidden_size], "max": [max_batch, 512, cfg.hidden_size]},
        "attention_mask": {"min": [1, 1], "opt": [1, 513], "max": [max_batch, max_seq + 512]},
        "position_ids": {"min": [1, 1], "opt": [1, 1], "max": [max_batch, 512]},
    }
    in_names, out_names = llm_io_names(cfg.num_layers)
    for name in in_names[len(LLM_LEAD_INPUTS):]:
        inputs.append(kv(name, "past"))
        profile[name] = {
            "min": [1, cfg.num_kv_heads, 0, cfg.head_dim],
            "opt": [1, cfg.num_kv_heads, 512, cfg.head_dim],
            "max": [max_batch, cfg.num_kv_heads, max_seq, cfg.head_dim],
        }
    for name in out_names[1:]:
        outputs.append(kv(name, "past_plus_seq"))
    return {"inputs": inputs, "outputs": outputs, "trt_profile": profile, "batching": LLM_BATCHING}


def _trace_inputs(cfg: LlmConfig) -> tuple[Tensor, ...]:
    """Example inputs with batch > 1, past > 0 and seq > 1 (so no size is specialised into the
    graph), one row left-padded."""
    batch, seq, past = 2, 3, 2
    gen = torch.Generator().manual_seed(0)  # keep the global RNG untouched
    embeds = torch.randn(batch, seq, cfg.hidden_size, generator=gen)
    mask = torch.ones(batch, past + seq, dtype=torch.int64)
    mask[1, 0] = 0
    positions = torch.tensor([[2, 3, 4], [1, 2, 3]], dtype=torch.int64)
    pasts = [torch.randn(batch, cfg.num_kv_heads, past, cfg.head_dim, generator=gen) for _ in range(2 * cfg.num_layers)]
    return (embeds, mask, positions, *pasts)


def _dynamic_axes(num_layers: int) -> dict[str, dict[int, str]]:
    in_names, out_names = llm_io_names(num_layers)
    dynamic: dict[str, dict[int, str]] = {
        "inputs_embeds": {0: "batch", 1: "seq"},
        "attention_mask": {0: "batch", 1: "past_plus_seq"},
        "position_ids": {0: "batch", 1: "seq"},
        "logits": {0: "batch"},
    }
    for name in in_names[len(LLM_LEAD_INPUTS):]:
        dynamic[name] = {0: "batch", 2: "past"}
    for name in out_names[1:]:
        dynamic[name] = {0: "batch", 2: "past_plus_seq"}
    return dynamic


def _torch_export(
    module: nn.Module,
    inputs: tuple[Tensor, ...],
    names: tuple[list[str], list[str]],
    dynamic_axes: dict[str, dict[int, str]],
    out_path: Path | str,
    opset: int,
) -> None:
    """torch.onnx.export as both LLM graphs use it (the TorchScript exporter, constants folded)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter is what we want
        torch.onnx.export(
            module,
            inputs,
            str(out_path),
            input_names=names[0],
            output_names=names[1],
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )


def _export(module: nn.Module, cfg: LlmConfig, out_path: Path | str, opset: int) -> None:
    _torch_export(module, _trace_inputs(cfg), llm_io_names(cfg.num_layers), _dynamic_axes(cfg.num_layers), out_path, opset)


@torch.no_grad()
def export_llm(model: CosyLlm, out_path: Path | str, opset: int = 17) -> dict[str, Any]:
    """Export the `llm` graph (fp32) to `out_path`; returns its manifest GRAPH entry (no variants)."""
    _export(_LlmOnnxWrapper(model.eval()), model.cfg, out_path, opset)
    return llm_graph_entry(model.cfg)


class _Fp16Io(nn.Module):
    """Runs a half-precision copy of the LLM behind float32 I/O (the manifest contract: every
    variant has fp32 inputs and outputs). RMSNorm already computes in float32 internally."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, inputs_embeds: Tensor, attention_mask: Tensor, position_ids: Tensor, *past: Tensor) -> tuple[Tensor, ...]:
        out = self.inner(inputs_embeds.half(), attention_mask, position_ids, *[p.half() for p in past])
        return tuple(o.float() for o in out)


@torch.no_grad()
def export_llm_fp16(model: CosyLlm, out_path: Path | str, opset: int = 17) -> None:
    """fp16 weights and compute, fp32 I/O. Converted in torch (`.half()`) rather than with
    onnxconverter-common, whose pass mislabels the types around the float32 RMSNorm islands."""
    import copy

    half = copy.deepcopy(model).half().eval()
    half.rope_inv_freq = model.rope_inv_freq.clone()  # angles stay float32, cast after cos/sin
    _export(_Fp16Io(_LlmOnnxWrapper(half)), model.cfg, out_path, opset)


# ----------------------------------------------------------------------------------------------
# ONNX: the fixed-shape step `llm_step` (slot cache written in place)
# ----------------------------------------------------------------------------------------------

#: Inputs before the per-layer cache, in graph order (graph `llm_step`).
LLM_STEP_LEAD_INPUTS = ["inputs_embeds", "slots", "start"]


def llm_step_io_names(num_layers: int) -> tuple[list[str], list[str]]:
    inputs = list(LLM_STEP_LEAD_INPUTS)
    outputs = ["logits"]
    for i in range(num_layers):
        inputs += [f"cache.{i}.key", f"cache.{i}.value"]
        outputs += [f"cache_out.{i}.key", f"cache_out.{i}.value"]
    return inputs, outputs


class _LlmStepOnnxWrapper(nn.Module):
    """Flat positional I/O for torch.onnx: inputs_embeds, slots, start, then (key, value) per layer."""

    def __init__(self, llm: CosyLlm) -> None:
        super().__init__()
        self.llm = llm

    def forward(self, inputs_embeds: Tensor, slots: Tensor, start: Tensor, *cache: Tensor) -> tuple[Tensor, ...]:
        pairs = [(cache[2 * i], cache[2 * i + 1]) for i in range(len(cache) // 2)]
        logits, written = self.llm.forward_slots(inputs_embeds, slots, start, pairs)
        flat: list[Tensor] = [logits]
        for k, v in written:
            flat.extend((k, v))
        return tuple(flat)


def llm_step_graph_entry(cfg: LlmConfig, max_positions: int = 4096, max_slots: int = 65, max_rows: int = 64) -> dict[str, Any]:
    """The manifest GRAPH entry (without `variants`) for the `llm_step` graph."""
    in_names, out_names = llm_step_io_names(cfg.num_layers)
    cache_shape: list[int | str] = ["num_slots", "max_positions", cfg.num_kv_heads, cfg.head_dim]
    inputs: list[dict[str, Any]] = [
        {"name": "inputs_embeds", "dtype": "float32", "shape": ["rows", "seq", cfg.hidden_size]},
        {"name": "slots", "dtype": "int64", "shape": ["rows"]},
        {"name": "start", "dtype": "int64", "shape": ["rows"]},
    ]
    inputs += [{"name": n, "dtype": "float32", "shape": cache_shape} for n in in_names[len(LLM_STEP_LEAD_INPUTS):]]
    outputs: list[dict[str, Any]] = [{"name": "logits", "dtype": "float32", "shape": ["rows", cfg.speech_vocab_size]}]
    outputs += [{"name": n, "dtype": "float32", "shape": cache_shape} for n in out_names[1:]]
    profile: dict[str, Any] = {
        "inputs_embeds": {"min": [1, 1, cfg.hidden_size], "opt": [1, 1, cfg.hidden_size], "max": [max_rows, 512, cfg.hidden_size]},
        "slots": {"min": [1], "opt": [1], "max": [max_rows]},
        "start": {"min": [1], "opt": [1], "max": [max_rows]},
    }
    for name in in_names[len(LLM_STEP_LEAD_INPUTS):]:
        profile[name] = {
            "min": [2, 1, cfg.num_kv_heads, cfg.head_dim],
            "opt": [max_slots, 2048, cfg.num_kv_heads, cfg.head_dim],
            "max": [max_slots, max_positions, cfg.num_kv_heads, cfg.head_dim],
        }
    return {"inputs": inputs, "outputs": outputs, "trt_profile": profile, "batching": LLM_STEP_BATCHING}


#: Manifest `graphs.llm_step.batching`: rows in fixed cache slots, new columns written in place.
LLM_STEP_BATCHING = "kv_slots"


def _step_trace_inputs(cfg: LlmConfig) -> tuple[Tensor, ...]:
    """Example inputs with rows > 1, seq > 1 and rows at different starts, so no size is
    specialised into the graph."""
    rows, seq, num_slots, max_positions = 2, 3, 4, 9
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(rows, seq, cfg.hidden_size, generator=gen)
    slots = torch.tensor([2, 0], dtype=torch.int64)
    start = torch.tensor([4, 1], dtype=torch.int64)
    shape = (num_slots, max_positions, cfg.num_kv_heads, cfg.head_dim)
    caches = [torch.randn(shape, generator=gen) for _ in range(2 * cfg.num_layers)]
    return (embeds, slots, start, *caches)


def _step_dynamic_axes(num_layers: int) -> dict[str, dict[int, str]]:
    in_names, out_names = llm_step_io_names(num_layers)
    dynamic: dict[str, dict[int, str]] = {
        "inputs_embeds": {0: "rows", 1: "seq"},
        "slots": {0: "rows"},
        "start": {0: "rows"},
        "logits": {0: "rows"},
    }
    for name in in_names[len(LLM_STEP_LEAD_INPUTS):] + out_names[1:]:
        dynamic[name] = {0: "num_slots", 1: "max_positions"}
    return dynamic


def _export_step(module: nn.Module, cfg: LlmConfig, out_path: Path | str, opset: int) -> None:
    names = llm_step_io_names(cfg.num_layers)
    _torch_export(module, _step_trace_inputs(cfg), names, _step_dynamic_axes(cfg.num_layers), out_path, opset)


@torch.no_grad()
def export_llm_step(model: CosyLlm, out_path: Path | str, opset: int = 17) -> dict[str, Any]:
    """Export the `llm_step` graph (fp32) to `out_path`; returns its manifest GRAPH entry (no variants)."""
    _export_step(_LlmStepOnnxWrapper(model.eval()), model.cfg, out_path, opset)
    return llm_step_graph_entry(model.cfg)

"""The CosyVoice3 flow (CausalMaskedDiffWithDiT) as our own PyTorch modules, the CFM solve, and the
ONNX exports `flow_front` and `dit` (docs/model-format.md).

Facts from cosyvoice3.md §5 and Appendix A:
* front: speaker = Linear(L2normalize(embedding)); tokens -> input_embedding; PreLookaheadLayer
  (k=4 conv over 3 look-ahead frames, leaky_relu 0.01, left-padded k=3 conv, residual); each token
  repeated to token_mel_ratio (2) mel frames.
* DiT (§5.4): time embedding (×1000, [sin, cos], MLP), input [x, cond, mu, spk] -> Linear -> causal
  grouped conv position embedding with Mish (+ residual), blocks of AdaLN-Zero attention (RoPE
  interleaved on the first dim_head channels only) and tanh-GELU FF, final AdaLN (scale, shift),
  projection. Block-causal attention uses 50-frame blocks counted from frame 0.
* CFM (§5.3): cosine t-schedule, Euler, CFG batch of 2 with 1.7·cond − 0.7·uncond, noise from a
  fixed buffer indexed from frame 0.

Module names mirror `flow.pt`, so the file loads strictly.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .checkpoint import check_dims, load_state_dict, match_state_dict, tensor_shape
from .constants import time_frequencies
from .yamlcfg import DitConfig, FlowConfig, load_model_config

CONV_POS_KERNEL = 31
CONV_POS_GROUPS = 16
TIME_FREQ_DIM = 256
LN_EPS = 1e-6


# ----------------------------------------------------------------------------------------------
# Front: speaker projection, token embedding, PreLookahead, ×2 upsampling
# ----------------------------------------------------------------------------------------------


class PreLookahead(nn.Module):
    """conv1 (k = lookahead+1, no padding) over frames + look-ahead, leaky_relu(0.01), left pad
    k2-1, conv2, residual. `forward` takes the frames WITH their look-ahead already appended."""

    def __init__(self, in_channels: int, channels: int, lookahead: int) -> None:
        super().__init__()
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(in_channels, channels, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(channels, in_channels, kernel_size=3)

    def forward(self, x_with_lookahead: Tensor) -> Tensor:
        """[B, C, n + lookahead] -> [B, C, n]"""
        h = F.leaky_relu(self.conv1(x_with_lookahead))
        h = F.pad(h, (self.conv2.kernel_size[0] - 1, 0))
        h = self.conv2(h)
        n = x_with_lookahead.shape[2] - self.lookahead
        return h + x_with_lookahead[:, :, :n]


class DiTTimeEmbedding(nn.Module):
    """SinusPositionEmbedding(256, scale 1000) then Linear-SiLU-Linear (keys `time_mlp.0/.2`)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.time_mlp = nn.Sequential(nn.Linear(TIME_FREQ_DIM, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        freqs = time_frequencies(TIME_FREQ_DIM // 2)  # the official torch.exp, rounded the same on every CPU
        angles = 1000 * t.unsqueeze(1) * freqs.unsqueeze(0)  # same op order as the official code
        return self.time_mlp(torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype))


class CausalConvPosEmbed(nn.Module):
    """Two (left pad k-1, grouped Conv1d, Mish) stages; keys `conv1.0`, `conv2.0`.

    The left pad is zeros at the sequence start; a call that continues after cached frames passes
    instead the k-1 frames before it of each conv's input (`context1`, `context2`, [B, k-1, D]),
    which makes the continuation exact (the convs are causal)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, CONV_POS_KERNEL, groups=CONV_POS_GROUPS), nn.Mish())

    def forward(self, x: Tensor) -> Tensor:
        """[B, T, D] -> [B, T, D]"""
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (CONV_POS_KERNEL - 1, 0)))
        h = self.conv2(F.pad(h, (CONV_POS_KERNEL - 1, 0)))
        return h.transpose(1, 2)

    def with_context(self, x: Tensor, context1: Tensor, context2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x [B, T, D], contexts [B, k-1, D] -> (out [B, T, D], padded input of conv1, padded
        input of conv2), both [B, k-1+T, D]: the k-1 frames of those ending at frame r of x are
        the context a later call starting at frame r needs."""
        in1 = torch.cat([context1, x], dim=1)
        c1 = self.conv1(in1.transpose(1, 2)).transpose(1, 2)
        in2 = torch.cat([context2, c1], dim=1)
        c2 = self.conv2(in2.transpose(1, 2)).transpose(1, 2)
        return c2, in1, in2


class DiTInputEmbedding(nn.Module):
    def __init__(self, cfg: DitConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.mel_dim * 2 + cfg.mu_dim + cfg.spk_dim, cfg.dim)
        self.conv_pos_embed = CausalConvPosEmbed(cfg.dim)

    def forward(
        self, x: Tensor, cond: Tensor, mu: Tensor, spks: Tensor, context1: Tensor | None = None,
        context2: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """x, cond, mu [B, T, C]; spks [B, S] -> ([B, T, D], conv inputs or None); channel order
        [x, cond, mu, spk]. With contexts it continues after the frames whose conv inputs they
        hold and also returns the padded conv inputs (CausalConvPosEmbed.with_context)."""
        spk = spks.unsqueeze(1).expand(-1, x.shape[1], -1)
        h = self.proj(torch.cat([x, cond, mu, spk], dim=-1))
        if context1 is None or context2 is None:
            return self.conv_pos_embed(h) + h, None, None
        conv, in1, in2 = self.conv_pos_embed.with_context(h, context1, context2)
        return conv + h, in1, in2


class RotaryTable(nn.Module):
    """x-transformers RotaryEmbedding: holds the persistent `inv_freq` buffer of flow.pt."""

    def __init__(self, dim_head: int) -> None:
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, dim_head, 2).float() / dim_head))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, seq_len_like: Tensor, offset_like: Tensor | None = None) -> Tensor:
        """Interleaved angles [T, 2·len(inv_freq)] = [θ0, θ0, θ1, θ1, ...] for positions
        P..P+T-1, where P = offset_like.shape[1] (the cached frames before; 0 without)."""
        t = seq_len_like.shape[1]
        if offset_like is None:
            pos = torch.arange(t, dtype=torch.float32)
        else:
            p = offset_like.shape[1]
            pos = torch.arange(p, p + t, dtype=torch.int64).to(torch.float32)
        freqs = pos.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)


def _apply_partial_rope(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate the first angles.shape[-1] channels of x [B, T, inner] (interleaved pairs (a, b) ->
    (-b, a)); the remaining channels pass unchanged (x-transformers partial rotary)."""
    rot = angles.shape[-1]
    head, tail = x[..., :rot], x[..., rot:]
    pairs = head.unflatten(-1, (rot // 2, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    head = head * angles.cos() + rotated * angles.sin()
    return torch.cat((head, tail), dim=-1)


class AdaLnZero(nn.Module):
    """`attn_norm`: Linear(SiLU(temb)) -> 6 chunks: shift_msa, scale_msa, gate_msa, shift_mlp,
    scale_mlp, gate_mlp."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * 6)

    def forward(self, temb: Tensor) -> tuple[Tensor, ...]:
        return torch.chunk(self.linear(F.silu(temb)), 6, dim=1)


class AdaLnZeroFinal(nn.Module):
    """`norm_out`: Linear(SiLU(temb)) -> (scale, shift), in that order."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim * 2)
        self.dim = dim

    def forward(self, x: Tensor, temb: Tensor) -> Tensor:
        scale, shift = torch.chunk(self.linear(F.silu(temb)), 2, dim=1)
        return F.layer_norm(x, (self.dim,), eps=LN_EPS) * (1 + scale)[:, None, :] + shift[:, None, :]


class DiTAttention(nn.Module):
    def __init__(self, cfg: DitConfig) -> None:
        super().__init__()
        inner = cfg.heads * cfg.dim_head
        self.heads = cfg.heads
        self.dim_head = cfg.dim_head
        self.to_q = nn.Linear(cfg.dim, inner)
        self.to_k = nn.Linear(cfg.dim, inner)
        self.to_v = nn.Linear(cfg.dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, cfg.dim)])

    def forward(
        self, x: Tensor, angles: Tensor, allowed: Tensor, past_k: Tensor | None = None, past_v: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Attention of x's frames over [past frames, x's frames]. past_k/past_v [B, P, inner]
        are the earlier frames' keys (after RoPE) and values; `allowed` is [B, 1, T, P+T].
        Returns (out, k, v) with this call's k (after RoPE) and v [B, T, inner]."""
        b, t, _ = x.shape
        q = _apply_partial_rope(self.to_q(x), angles)
        k_new = _apply_partial_rope(self.to_k(x), angles)
        v_new = self.to_v(x)
        k = k_new if past_k is None else torch.cat([past_k, k_new], dim=1)
        v = v_new if past_v is None else torch.cat([past_v, v_new], dim=1)
        q = q.view(b, t, self.heads, self.dim_head).transpose(1, 2)
        k = k.view(b, -1, self.heads, self.dim_head).transpose(1, 2)
        v = v.view(b, -1, self.heads, self.dim_head).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) * (self.dim_head**-0.5)
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, self.heads * self.dim_head)
        return self.to_out[0](out), k_new, v_new


class GatedResidual(nn.Module):
    """h + gate·y. A module of its own so its ONNX nodes are named `.../…_residual/...` and the
    mixed-precision variant can keep the residual stream in fp32."""

    def forward(self, h: Tensor, gate: Tensor, y: Tensor) -> Tensor:
        return h + gate.unsqueeze(1) * y


class DiTFeedForward(nn.Module):
    """Keys `ff.0.0` (Linear in) and `ff.2` (Linear out); tanh-approximate GELU between."""

    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        inner = dim * mult
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Identity(), nn.Linear(inner, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, cfg: DitConfig) -> None:
        super().__init__()
        self.attn_norm = AdaLnZero(cfg.dim)
        self.attn = DiTAttention(cfg)
        self.ff = DiTFeedForward(cfg.dim, cfg.ff_mult)
        self.attn_residual = GatedResidual()
        self.ff_residual = GatedResidual()
        self.dim = cfg.dim  # static, so LayerNorm exports with a constant normalized shape

    def forward(
        self, h: Tensor, temb: Tensor, angles: Tensor, allowed: Tensor, keep: Tensor,
        past_k: Tensor | None = None, past_v: Tensor | None = None,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The block over h's frames (after cached frames when past_k/past_v are given,
        DiTAttention.forward); returns (h, k, v) with this call's keys and values."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm(temb)
        dim = (self.dim,)
        n = F.layer_norm(h, dim, eps=LN_EPS) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        attn, k, v = self.attn(n, angles, allowed, past_k, past_v)
        attn = attn * keep  # rows of padded frames are zeroed
        h = self.attn_residual(h, gate_msa, attn)
        n = F.layer_norm(h, dim, eps=LN_EPS) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        return self.ff_residual(h, gate_mlp, self.ff(n)), k, v


def attention_allowed(mask: Tensor, block_frames: Tensor) -> Tensor:
    """Boolean [B, 1, T, T]: key j valid (mask) and, when block_frames > 0, j < (⌊i/bf⌋+1)·bf.
    block_frames <= 0 means full attention (a block of T frames covers everything)."""
    t = mask.shape[-1]
    idx = torch.arange(t, dtype=torch.int64)
    seq = torch.full_like(block_frames, t)
    bf = torch.where(block_frames > 0, block_frames, seq)
    limit = (torch.div(idx, bf, rounding_mode="floor") + 1) * bf  # [T]
    causal = idx.unsqueeze(0) < limit.unsqueeze(1)  # [T(query), T(key)]
    keys = mask[:, 0, :] > 0  # [B, T]
    return (causal.unsqueeze(0) & keys.unsqueeze(1)).unsqueeze(1)


def attention_allowed_after(mask: Tensor, block_frames: Tensor, past_like: Tensor) -> Tensor:
    """Boolean [B, 1, T, P+T] for T query frames at absolute positions P..P+T-1 (P =
    past_like.shape[1] cached frames before them) over keys 0..P+T-1: the cached keys are all
    valid, this call's keys are valid where `mask` [B, 1, T] is; with block_frames > 0 key j is
    allowed for query i when j < (⌊i/bf⌋+1)·bf. With P = 0 this is `attention_allowed`."""
    t = mask.shape[-1]
    p = past_like.shape[1]
    keys_idx = torch.arange(p + t, dtype=torch.int64)
    query_idx = torch.arange(p, p + t, dtype=torch.int64)
    total = torch.full_like(block_frames, p + t)
    bf = torch.where(block_frames > 0, block_frames, total)
    limit = (torch.div(query_idx, bf, rounding_mode="floor") + 1) * bf  # [T]
    causal = keys_idx.unsqueeze(0) < limit.unsqueeze(1)  # [T(query), P+T(key)]
    past_keys = torch.ones(mask.shape[0], p, dtype=torch.bool)
    keys = torch.cat([past_keys, mask[:, 0, :] > 0], dim=1)  # [B, P+T]
    return (causal.unsqueeze(0) & keys.unsqueeze(1)).unsqueeze(1)


class DiT(nn.Module):
    """The flow estimator. forward(x, mask, mu, t, spks, cond, block_frames) -> [B, 80, T].

    With the cache inputs (the exported graph, `forward_cached`) it also continues after cached
    leading frames (the prompt-prefix cache, docs/model-format.md "dit prompt cache"): their
    per-layer keys/values and the positional convs' input context come in, and the same state of
    chosen leading frames of this call comes out."""

    def __init__(self, cfg: DitConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.time_embed = DiTTimeEmbedding(cfg.dim)
        self.input_embed = DiTInputEmbedding(cfg)
        self.rotary_embed = RotaryTable(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = AdaLnZeroFinal(cfg.dim)
        self.proj_out = nn.Linear(cfg.dim, cfg.mel_dim)

    def forward(
        self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor, block_frames: Tensor,
        *cache: Tensor,
    ) -> Any:
        """Without `cache`: v [B, 80, T]. With the five cache inputs: `forward_cached`."""
        if cache:
            return self.forward_cached(x, mask, mu, t, spks, cond, block_frames, *cache)
        temb = self.time_embed(t)
        h, _, _ = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        angles = self.rotary_embed(h)
        allowed = attention_allowed(mask, block_frames)
        keep = (mask[:, 0, :] > 0).unsqueeze(-1).to(h.dtype)
        for block in self.transformer_blocks:
            h = block(h, temb, angles, allowed, keep)[0]
        h = self.norm_out(h, temb)
        return self.proj_out(h).transpose(1, 2)

    def forward_cached(
        self, x: Tensor, mask: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor, block_frames: Tensor,
        cache_k: Tensor, cache_v: Tensor, cache_conv1: Tensor, cache_conv2: Tensor, record_frames: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """x, mu, cond [B, 80, T], mask [B, 1, T]: the T frames after P cached ones.
        cache_k/cache_v [depth, B, P, inner]: every layer's keys (after RoPE) and values of the
        cached frames; cache_conv1/2 [B, k-1, D]: the positional convs' inputs of the k-1 frames
        before (zeros when P = 0: the convs' own zero pad). record_frames [1] = R <= T.
        Returns (v [B, 80, T], this call's k and v of its first R frames [depth, B, R, inner],
        the conv contexts a call starting after those R frames needs [B, k-1, D] each)."""
        temb = self.time_embed(t)
        h, in1, in2 = self.input_embed(
            x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks, cache_conv1, cache_conv2
        )
        past_like = cache_k[0, :1]  # [1, P, inner]: only its length is used
        angles = self.rotary_embed(h, past_like)
        allowed = attention_allowed_after(mask, block_frames, past_like)
        keep = (mask[:, 0, :] > 0).unsqueeze(-1).to(h.dtype)
        record = torch.arange(record_frames[0], dtype=torch.int64)  # frames 0..R-1 of this call
        ks, vs = [], []
        for i, block in enumerate(self.transformer_blocks):
            h, k, v = block(h, temb, angles, allowed, keep, cache_k[i], cache_v[i])
            ks.append(torch.index_select(k, 1, record))
            vs.append(torch.index_select(v, 1, record))
        h = self.norm_out(h, temb)
        out = self.proj_out(h).transpose(1, 2)
        assert in1 is not None and in2 is not None
        # in1/in2 start k-1 frames before this call: frames R-(k-1)..R-1 are at R..R+k-2
        ctx = torch.arange(CONV_POS_KERNEL - 1, dtype=torch.int64) + record_frames[0]
        return out, torch.stack(ks), torch.stack(vs), torch.index_select(in1, 1, ctx), torch.index_select(in2, 1, ctx)


class _Decoder(nn.Module):
    """Stands for CausalConditionalCFM: holds `estimator` (key prefix `decoder.estimator.`)."""

    def __init__(self, cfg: DitConfig) -> None:
        super().__init__()
        self.estimator = DiT(cfg)


class CosyFlow(nn.Module):
    """CausalMaskedDiffWithDiT for inference; keys as in flow.pt."""

    def __init__(self, cfg: FlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.input_embedding = nn.Embedding(cfg.vocab_size, cfg.input_size)
        self.spk_embed_affine_layer = nn.Linear(cfg.spk_embed_dim, cfg.output_size)
        self.pre_lookahead_layer = PreLookahead(cfg.input_size, cfg.pre_lookahead_channels, cfg.pre_lookahead_len)
        self.decoder = _Decoder(cfg.dit)

    @property
    def dit(self) -> DiT:
        return self.decoder.estimator

    def speaker(self, embedding: Tensor) -> Tensor:
        """[B, 192] campplus output -> [B, 80]."""
        return self.spk_embed_affine_layer(F.normalize(embedding, dim=1, eps=1e-12))

    def front(self, tokens: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """tokens [1, n] (last `pre_lookahead_len` = look-ahead context; −1 = zero frame) ->
        mu [1, 80, ratio·(n − lookahead)], spks [1, 80]."""
        valid = (tokens >= 0).unsqueeze(-1).to(torch.float32)
        x = self.input_embedding(torch.clamp(tokens, min=0)) * valid  # [1, n, 80]
        h = self.pre_lookahead_layer(x.transpose(1, 2))  # [1, 80, n - L]
        mu = h.repeat_interleave(self.cfg.token_mel_ratio, dim=2)
        return mu, self.speaker(embedding)


def cfm_time_span(n_timesteps: int = 10, scheduler: str = "cosine") -> Tensor:
    """float32 t grid; cosine: 1 − cos(t·π/2), computed in float32 as the official code does."""
    t = torch.linspace(0, 1, n_timesteps + 1, dtype=torch.float32)
    if scheduler == "cosine":
        t = 1 - torch.cos(t * 0.5 * torch.pi)
    return t


@torch.no_grad()
def cfm_solve(
    dit: DiT,
    noise: Tensor,
    mu: Tensor,
    spks: Tensor,
    cond: Tensor,
    cfg_rate: float = 0.7,
    n_timesteps: int = 10,
    block_frames: int = 0,
    scheduler: str = "cosine",
) -> Tensor:
    """Euler solve with CFG (§5.3). noise/mu/cond [1, 80, T], spks [1, 80] -> mel [1, 80, T].
    Row 0 is conditional, row 1 has mu, spks and cond zeroed; v = (1+r)·v0 − r·v1."""
    t_span = cfm_time_span(n_timesteps, scheduler)
    frames = mu.shape[2]
    x = noise[:, :, :frames].to(torch.float32)
    mask = torch.ones(2, 1, frames)
    mu_in = torch.cat([mu, torch.zeros_like(mu)])
    spks_in = torch.cat([spks, torch.zeros_like(spks)])
    cond_in = torch.cat([cond, torch.zeros_like(cond)])
    bf = torch.tensor([block_frames], dtype=torch.int64)
    t = t_span[0:1]
    dt = t_span[1] - t_span[0]
    for step in range(1, len(t_span)):
        v = dit(torch.cat([x, x]), mask, mu_in, t.expand(2).contiguous(), spks_in, cond_in, bf)
        v = (1.0 + cfg_rate) * v[:1] - cfg_rate * v[1:]
        x = x + dt * v
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x


@torch.no_grad()
def flow_inference(
    flow: CosyFlow,
    noise: Tensor,
    speech_tokens: Tensor,
    prompt_tokens: Tensor,
    prompt_feat: Tensor,
    embedding: Tensor,
    finalize: bool = True,
    streaming: bool = False,
) -> dict[str, Tensor]:
    """Offline/streaming flow call (§5.1). Returns mu, cond, and mel (prompt frames removed)."""
    tokens = torch.cat([prompt_tokens.reshape(1, -1), speech_tokens.reshape(1, -1)], dim=1).to(torch.int64)
    look = flow.cfg.pre_lookahead_len
    if finalize:
        tokens = torch.cat([tokens, torch.full((1, look), -1, dtype=torch.int64)], dim=1)
    mu, spks = flow.front(tokens, embedding)
    frames = mu.shape[2]
    prompt_frames = prompt_feat.shape[1]
    cond = torch.zeros(1, flow.cfg.output_size, frames)
    cond[:, :, :prompt_frames] = prompt_feat.transpose(1, 2)
    block = flow.cfg.dit.static_chunk_size if streaming else 0
    mel = cfm_solve(flow.dit, noise, mu, spks, cond, flow.cfg.inference_cfg_rate, 10, block, flow.cfg.t_scheduler)
    return {"mu": mu, "cond": cond, "mel": mel[:, :, prompt_frames:], "spks": spks}


def check_flow_dims(cfg: FlowConfig, sd: dict[str, Tensor], file: Path | str) -> None:
    """The yaml numbers must agree with flow.pt before strict loading."""
    emb = tensor_shape(sd, "input_embedding.weight", file)
    check_dims("flow.vocab_size", cfg.vocab_size, emb[0], file)
    check_dims("flow.input_size", cfg.input_size, emb[1], file)
    spk = tensor_shape(sd, "spk_embed_affine_layer.weight", file)
    check_dims("flow.spk_embed_dim", cfg.spk_embed_dim, spk[1], file)
    check_dims("flow.output_size", cfg.output_size, spk[0], file)
    c1 = tensor_shape(sd, "pre_lookahead_layer.conv1.weight", file)
    check_dims("flow.pre_lookahead_layer.channels", cfg.pre_lookahead_channels, c1[0], file)
    check_dims("flow.pre_lookahead_len + 1 (conv1 kernel)", cfg.pre_lookahead_len + 1, c1[2], file)
    d = cfg.dit
    p = "decoder.estimator."
    check_dims("dit.dim", d.dim, tensor_shape(sd, p + "proj_out.weight", file)[1], file)
    check_dims("dit.mel_dim", d.mel_dim, tensor_shape(sd, p + "proj_out.weight", file)[0], file)
    check_dims("dit.heads * dit.dim_head", d.heads * d.dim_head, tensor_shape(sd, p + "transformer_blocks.0.attn.to_q.weight", file)[0], file)
    check_dims("dit.dim_head / 2 (rotary inv_freq)", d.dim_head // 2, tensor_shape(sd, p + "rotary_embed.inv_freq", file)[0], file)
    depth = 1 + max((int(k.split(".")[3]) for k in sd if k.startswith(p + "transformer_blocks.")), default=-1)
    check_dims("dit.depth", d.depth, depth, file)
    check_dims("dit.ff_mult * dim", d.ff_mult * d.dim, tensor_shape(sd, p + "transformer_blocks.0.ff.ff.0.0.weight", file)[0], file)
    check_dims("dit input (2·mel_dim + mu_dim + spk_dim)", 2 * d.mel_dim + d.mu_dim + d.spk_dim, tensor_shape(sd, p + "input_embed.proj.weight", file)[1], file)
    conv = tensor_shape(sd, p + "input_embed.conv_pos_embed.conv1.0.weight", file)
    check_dims("conv_pos_embed channels per group (dim / 16)", d.dim // CONV_POS_GROUPS, conv[1], file)


def load_flow(model_dir: Path | str, cfg: FlowConfig | None = None) -> CosyFlow:
    """Build CosyFlow from `<model_dir>/cosyvoice3.yaml` and load `flow.pt` strictly."""
    model_dir = Path(model_dir)
    cfg = cfg or load_model_config(model_dir).flow
    path = model_dir / "flow.pt"
    sd = load_state_dict(path)
    check_flow_dims(cfg, sd, path)
    model = CosyFlow(cfg)
    match_state_dict(model, sd, path)
    return model.eval().requires_grad_(False)


# ----------------------------------------------------------------------------------------------
# ONNX
# ----------------------------------------------------------------------------------------------


class _FrontOnnx(nn.Module):
    def __init__(self, flow: CosyFlow) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, tokens: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        return self.flow.front(tokens, embedding)


def _export(module: nn.Module, args: tuple[Tensor, ...], path: Path, inputs: list[str], outputs: list[str],
            dynamic: dict[str, dict[int, str]], opset: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript-exporter deprecation and tracer notes
        torch.onnx.export(
            module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=dynamic,
            opset_version=opset, do_constant_folding=True, dynamo=False,
        )


def _io(name: str, dtype: str, shape: list[Any]) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": shape}


@torch.no_grad()
def export_flow_front(flow: CosyFlow, out_path: Path | str, opset: int = 17) -> dict[str, Any]:
    """Export `flow_front` (tokens int64 [1, n], embedding [1, 192] -> mu, spks); returns the
    manifest GRAPH entry (without variants)."""
    cfg = flow.cfg
    n = 11
    tokens = torch.arange(n, dtype=torch.int64).unsqueeze(0) * 7
    tokens[0, -cfg.pre_lookahead_len:] = -1
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(1, cfg.spk_embed_dim, generator=gen)
    _export(_FrontOnnx(flow.eval()), (tokens, emb), Path(out_path), ["tokens", "embedding"], ["mu", "spks"],
            {"tokens": {1: "n"}, "mu": {2: "frames"}}, opset)
    return {
        "inputs": [_io("tokens", "int64", [1, "n"]), _io("embedding", "float32", [1, cfg.spk_embed_dim])],
        "outputs": [_io("mu", "float32", [1, cfg.output_size, "frames"]), _io("spks", "float32", [1, cfg.output_size])],
        "trt_profile": {"tokens": {"min": [1, cfg.pre_lookahead_len + 1], "opt": [1, 250], "max": [1, 1500 + cfg.pre_lookahead_len]}},
    }


DIT_INPUTS = ["x", "mask", "mu", "t", "spks", "cond", "block_frames"]
# The prompt-prefix cache inputs and outputs (docs/model-format.md "dit prompt cache"); a graph
# without them (older folders) is run without a cache.
DIT_CACHE_INPUTS = ["cache_k", "cache_v", "cache_conv1", "cache_conv2", "record_frames"]
DIT_OUTPUTS = ["estimator_out", "record_k", "record_v", "record_conv1", "record_conv2"]


@torch.no_grad()
def export_dit(dit: DiT, out_path: Path | str, opset: int = 17) -> dict[str, Any]:
    """Export `dit` (fp32) with dynamic batch and frames and the prompt-cache I/O; returns the
    manifest GRAPH entry."""
    c = dit.cfg
    gen = torch.Generator().manual_seed(0)
    b, t, past, record = 2, 67, 50, 20  # nonzero past/record so no shape is traced as a constant
    inner = c.heads * c.dim_head
    ctx = CONV_POS_KERNEL - 1
    args = (
        torch.randn(b, c.mel_dim, t, generator=gen),
        torch.ones(b, 1, t),
        torch.randn(b, c.mu_dim, t, generator=gen),
        torch.rand(b, generator=gen),
        torch.randn(b, c.spk_dim, generator=gen),
        torch.randn(b, c.mel_dim, t, generator=gen),
        torch.tensor([c.static_chunk_size], dtype=torch.int64),
        torch.randn(c.depth, b, past, inner, generator=gen),
        torch.randn(c.depth, b, past, inner, generator=gen),
        torch.randn(b, ctx, c.dim, generator=gen),
        torch.randn(b, ctx, c.dim, generator=gen),
        torch.tensor([record], dtype=torch.int64),
    )
    dyn = {0: "batch"}
    frames3 = {0: "batch", 2: "frames"}
    dynamic = {
        "x": frames3, "mask": frames3, "mu": frames3, "t": dyn, "spks": dyn, "cond": frames3,
        "cache_k": {1: "batch", 2: "past"}, "cache_v": {1: "batch", 2: "past"}, "cache_conv1": dyn, "cache_conv2": dyn,
        "estimator_out": frames3, "record_k": {1: "batch", 2: "record"}, "record_v": {1: "batch", 2: "record"},
        "record_conv1": dyn, "record_conv2": dyn,
    }
    _export(dit.eval(), args, Path(out_path), DIT_INPUTS + DIT_CACHE_INPUTS, DIT_OUTPUTS, dynamic, opset)
    mel3 = lambda ch: ["batch", ch, "frames"]  # noqa: E731
    prof3 = lambda ch: {"min": [2, ch, 4], "opt": [2, ch, 500], "max": [2, ch, 3000]}  # noqa: E731
    kv = lambda n: [c.depth, "batch", n, inner]  # noqa: E731
    conv = ["batch", ctx, c.dim]
    kv_prof = {"min": [c.depth, 2, 0, inner], "opt": [c.depth, 2, 100, inner], "max": [c.depth, 2, 1500, inner]}
    conv_prof = {"min": [2, ctx, c.dim], "opt": [2, ctx, c.dim], "max": [2, ctx, c.dim]}
    return {
        "inputs": [
            _io("x", "float32", mel3(c.mel_dim)), _io("mask", "float32", mel3(1)), _io("mu", "float32", mel3(c.mu_dim)),
            _io("t", "float32", ["batch"]), _io("spks", "float32", ["batch", c.spk_dim]),
            _io("cond", "float32", mel3(c.mel_dim)), _io("block_frames", "int64", [1]),
            _io("cache_k", "float32", kv("past")), _io("cache_v", "float32", kv("past")),
            _io("cache_conv1", "float32", conv), _io("cache_conv2", "float32", conv),
            _io("record_frames", "int64", [1]),
        ],
        "outputs": [
            _io("estimator_out", "float32", mel3(c.mel_dim)),
            _io("record_k", "float32", kv("record")), _io("record_v", "float32", kv("record")),
            _io("record_conv1", "float32", conv), _io("record_conv2", "float32", conv),
        ],
        "trt_profile": {
            "x": prof3(c.mel_dim), "mask": prof3(1), "mu": prof3(c.mu_dim), "cond": prof3(c.mel_dim),
            "t": {"min": [2], "opt": [2], "max": [2]},
            "spks": {"min": [2, c.spk_dim], "opt": [2, c.spk_dim], "max": [2, c.spk_dim]},
            "block_frames": {"min": [1], "opt": [1], "max": [1]},
            "cache_k": kv_prof, "cache_v": kv_prof, "cache_conv1": conv_prof, "cache_conv2": conv_prof,
            "record_frames": {"min": [1], "opt": [1], "max": [1]},
        },
    }


# The mixed variant computes the transformer blocks' matmuls and elementwise work in fp16 and keeps
# float32 for: everything outside the blocks (time embedding = sin/cos of 1000·t, input embedding =
# origin of the residual stream, rotary angles, the mask, final norm and projection), every
# LayerNorm and softmax, and the gated residual adds (`*_residual` modules) that carry the stream.
MIXED_FP32_BLOCK_SCOPES = ("_residual/",)
MIXED_FP32_OPS = ["LayerNormalization", "Softmax", "ReduceMean", "Range", "Sin", "Cos", "Exp", "Softplus"]


def dit_mixed_fp32_nodes(model: Any) -> list[str]:
    """Names of the DiT graph nodes that the mixed variant keeps in float32."""
    return [
        n.name
        for n in model.graph.node
        if not n.name.startswith("/transformer_blocks.") or any(s in n.name for s in MIXED_FP32_BLOCK_SCOPES)
    ]


def make_dit_mixed_fp16(fp32_path: Path | str, out_path: Path | str) -> None:
    """fp16 variant of the `dit` graph with fp32 I/O and fp32 LayerNorm, softmax and residual
    stream (cosyvoice3.md §9.17: a plain fp16 DiT overflows in LayerNorm and gives NaN)."""
    import onnx
    from onnxconverter_common import float16

    model = onnx.load(str(fp32_path))
    op_block = sorted(set(MIXED_FP32_OPS) | set(float16.DEFAULT_OP_BLOCK_LIST))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "-inf truncated to -10000" for the attention mask fill
        mixed = float16.convert_float_to_float16(
            model, keep_io_types=True, op_block_list=op_block, node_block_list=dit_mixed_fp32_nodes(model)
        )
    _restore_fp32_outputs(model, mixed)
    onnx.checker.check_model(mixed)
    onnx.save(mixed, str(out_path))


def _restore_fp32_outputs(fp32: Any, mixed: Any) -> None:
    """onnxconverter-common relabels a graph output as float16 even when the node producing it was
    kept in float32 (here: the final projection outside the blocks). Put the declared type back
    (the runtime contract is fp32 I/O for every variant), casting only if the producer really is
    fp16."""
    import onnx
    from onnx import helper

    original = {o.name: o.type.tensor_type.elem_type for o in fp32.graph.output}
    kept_fp32 = set(dit_mixed_fp32_nodes(fp32))
    producers = {out: n for n in mixed.graph.node for out in n.output}
    for out in mixed.graph.output:
        want = original.get(out.name)
        if want is None or out.type.tensor_type.elem_type == want:
            continue
        node = producers.get(out.name)
        if node is not None and node.name not in kept_fp32:
            inner = out.name + "_fp16"
            node.output[list(node.output).index(out.name)] = inner
            mixed.graph.node.append(helper.make_node("Cast", [inner], [out.name], to=want, name=out.name + "_to_fp32"))
        out.type.tensor_type.elem_type = want

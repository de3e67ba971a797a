"""Random-weight CosyVoice3 model folders in the OFFICIAL layout (for tests and benchmarks).

``write_random_model(out_dir, size, seed)`` writes what ``Fun-CosyVoice3-0.5B`` contains and the
normal export path reads (cosyvoice3.md §1.1, §1.3, Appendix A/B/C):

* ``cosyvoice3.yaml`` -- the official example yaml with the model sizes substituted;
* ``llm.pt``, ``flow.pt``, ``hift.pt`` -- ``torch.save``'d state dicts with the official key names,
  order and shapes (hift in the ``parametrizations.weight.original0/1`` weight-norm form, flow with the
  real ``rotary_embed.inv_freq`` buffer, llm with ``lm_head`` sharing ``embed_tokens``' storage);
* ``campplus.onnx`` / ``speech_tokenizer_v3.onnx`` -- tiny stand-in networks with the official I/O
  names (reference/README.md §2.4);
* ``CosyVoice-BlankEN/`` -- Qwen2 ``config.json``, ``generation_config.json``, ``tokenizer_config.json``
  and a small byte-level BPE (``vocab.json`` + ``merges.txt``) padded with unreachable fillers so that
  ``<|endoftext|>`` lands on 151643. **No ``model.safetensors``**: the official code overwrites the
  Qwen weights with ``llm.pt`` and our exporter never reads it.

Weights come from one seeded ``torch.Generator`` in key order: matrices N(0, 1/fan_in), embeddings
N(0, 1), biases N(0, 0.02²), norm scales and Snake alphas 1 + N(0, 0.1²), weight-norm g = ‖v‖ per
output channel. Adjustments (as in the reference tiny model): ``llm_decoder`` ×4 so logits are about
N(0, 16); HiFT f0 classifier ×60 with zero bias (voiced frames), conv_post g ×0.3 and −0.5 on the
log-magnitude bias channels (quiet, unclipped audio). The output is bit-identical for a given
(size, seed): no timestamps, no dict-order or thread dependence, and the same on every CPU where torch
runs its AVX2 or AVX-512 kernels (onnx/tests/test_fixture.py says why).
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .constants import rope_inverse_frequencies

__all__ = ["ModelSizes", "SIZES", "write_random_model", "llm_param_shapes", "flow_param_shapes",
           "hift_param_shapes", "render_yaml"]  # fmt: skip

# ----------------------------------------------------------------------------------------------------
# Sizes
# ----------------------------------------------------------------------------------------------------

TEXT_VOCAB = 151936  # Qwen2 embed_tokens rows
BASE_VOCAB = 151643  # BPE entries before <|endoftext|>
SPEECH_TOKENS = 6561  # FSQ 3^8
SPEECH_VOCAB = SPEECH_TOKENS + 200  # + sos/eos/task/fill/reserved (all stop ids)
MEL = 80
SPK_EMBED = 192
PRE_LOOKAHEAD = 3
DIT_FF_MULT = 2
DIT_CONV_POS_GROUPS = 16
DIT_CONV_POS_KERNEL = 31
HIFT_UPSAMPLE_RATES = (8, 5, 3)
HIFT_UPSAMPLE_KERNELS = (16, 11, 7)
HIFT_RESBLOCK_KERNELS = (3, 7, 11)
HIFT_SOURCE_RESBLOCK_KERNELS = (7, 7, 11)
HIFT_DILATIONS = (1, 3, 5)
HIFT_ISTFT_N_FFT = 16
HIFT_NB_HARMONICS = 8
HIFT_CONV_PRE_KERNEL = 5  # conv_pre_look_right 4 + 1
F0_CONDNET_LAYERS = 5


@dataclass(frozen=True)
class ModelSizes:
    """The sizes that differ between the reference tiny model and the released model."""

    llm_hidden: int
    llm_layers: int
    llm_heads: int
    llm_kv_heads: int
    llm_intermediate: int
    pre_lookahead_channels: int
    dit_dim: int
    dit_depth: int
    dit_heads: int
    dit_dim_head: int
    hift_base: int
    f0_cond: int

    @property
    def llm_head_dim(self) -> int:
        return self.llm_hidden // self.llm_heads


SIZES: dict[str, ModelSizes] = {
    "tiny": ModelSizes(16, 2, 4, 2, 48, 48, 48, 3, 3, 16, 24, 24),
    "full": ModelSizes(896, 24, 14, 2, 4864, 1024, 1024, 22, 16, 64, 512, 512),
}

# Parameter kinds -> initialisation.
MATRIX, EMBEDDING, BIAS, SCALE, WN_G, INV_FREQ, TIED = "matrix", "embedding", "bias", "scale", "wn_g", "inv_freq", "tied"

ParamSpec = tuple[str, tuple[int, ...], str]


def llm_param_shapes(s: ModelSizes) -> list[ParamSpec]:
    """``llm.pt`` keys in state-dict order (Appendix C)."""
    kv = s.llm_kv_heads * s.llm_head_dim
    h, i = s.llm_hidden, s.llm_intermediate
    specs: list[ParamSpec] = [("llm.model.model.embed_tokens.weight", (TEXT_VOCAB, h), EMBEDDING)]
    for layer in range(s.llm_layers):
        p = f"llm.model.model.layers.{layer}."
        specs += [
            (p + "self_attn.q_proj.weight", (h, h), MATRIX),
            (p + "self_attn.q_proj.bias", (h,), BIAS),
            (p + "self_attn.k_proj.weight", (kv, h), MATRIX),
            (p + "self_attn.k_proj.bias", (kv,), BIAS),
            (p + "self_attn.v_proj.weight", (kv, h), MATRIX),
            (p + "self_attn.v_proj.bias", (kv,), BIAS),
            (p + "self_attn.o_proj.weight", (h, h), MATRIX),
            (p + "mlp.gate_proj.weight", (i, h), MATRIX),
            (p + "mlp.up_proj.weight", (i, h), MATRIX),
            (p + "mlp.down_proj.weight", (h, i), MATRIX),
            (p + "input_layernorm.weight", (h,), SCALE),
            (p + "post_attention_layernorm.weight", (h,), SCALE),
        ]
    specs += [
        ("llm.model.model.norm.weight", (h,), SCALE),
        ("llm.model.lm_head.weight", (TEXT_VOCAB, h), TIED),
        ("llm_decoder.weight", (SPEECH_VOCAB, h), MATRIX),
        ("speech_embedding.weight", (SPEECH_VOCAB, h), EMBEDDING),
    ]
    return specs


def _linear(name: str, out_f: int, in_f: int) -> list[ParamSpec]:
    return [(name + ".weight", (out_f, in_f), MATRIX), (name + ".bias", (out_f,), BIAS)]


def _conv(name: str, out_c: int, in_c: int, k: int) -> list[ParamSpec]:
    return [(name + ".weight", (out_c, in_c, k), MATRIX), (name + ".bias", (out_c,), BIAS)]


def flow_param_shapes(s: ModelSizes) -> list[ParamSpec]:
    """``flow.pt`` keys in state-dict order (Appendix A)."""
    d, inner, ff = s.dit_dim, s.dit_heads * s.dit_dim_head, s.dit_dim * DIT_FF_MULT
    e = "decoder.estimator."
    specs: list[ParamSpec] = [("input_embedding.weight", (SPEECH_TOKENS, MEL), EMBEDDING)]
    specs += _linear("spk_embed_affine_layer", MEL, SPK_EMBED)
    specs += _conv("pre_lookahead_layer.conv1", s.pre_lookahead_channels, MEL, PRE_LOOKAHEAD + 1)
    specs += _conv("pre_lookahead_layer.conv2", MEL, s.pre_lookahead_channels, 3)
    specs += _linear(e + "time_embed.time_mlp.0", d, 256)
    specs += _linear(e + "time_embed.time_mlp.2", d, d)
    specs += _linear(e + "input_embed.proj", d, 4 * MEL)  # [x, cond, mu, spk]
    if d % DIT_CONV_POS_GROUPS:
        raise ValueError(f"DiT dim {d} must be divisible by {DIT_CONV_POS_GROUPS} (conv_pos_embed groups)")
    for conv in ("conv1", "conv2"):
        specs += _conv(e + f"input_embed.conv_pos_embed.{conv}.0", d, d // DIT_CONV_POS_GROUPS, DIT_CONV_POS_KERNEL)
    specs.append((e + "rotary_embed.inv_freq", (s.dit_dim_head // 2,), INV_FREQ))
    for block in range(s.dit_depth):
        b = e + f"transformer_blocks.{block}."
        specs += _linear(b + "attn_norm.linear", 6 * d, d)
        specs += _linear(b + "attn.to_q", inner, d)
        specs += _linear(b + "attn.to_k", inner, d)
        specs += _linear(b + "attn.to_v", inner, d)
        specs += _linear(b + "attn.to_out.0", d, inner)
        specs += _linear(b + "ff.ff.0.0", ff, d)
        specs += _linear(b + "ff.ff.2", d, ff)
    specs += _linear(e + "norm_out.linear", 2 * d, d)
    specs += _linear(e + "proj_out", MEL, d)
    return specs


def _wn_conv(name: str, out_c: int, in_c: int, k: int) -> list[ParamSpec]:
    p = name + ".parametrizations.weight."
    return [(name + ".bias", (out_c,), BIAS), (p + "original0", (out_c, 1, 1), WN_G), (p + "original1", (out_c, in_c, k), MATRIX)]


def _resblock(name: str, ch: int, k: int) -> list[ParamSpec]:
    specs: list[ParamSpec] = []
    for group in ("convs1", "convs2"):
        for j in range(len(HIFT_DILATIONS)):
            specs += _wn_conv(f"{name}.{group}.{j}", ch, ch, k)
    for group in ("activations1", "activations2"):
        for j in range(len(HIFT_DILATIONS)):
            specs.append((f"{name}.{group}.{j}.alpha", (ch,), SCALE))
    return specs


def hift_param_shapes(s: ModelSizes) -> list[ParamSpec]:
    """``hift.pt`` keys in state-dict order (Appendix B)."""
    base = s.hift_base
    n_stages = len(HIFT_UPSAMPLE_RATES)
    if base % (2**n_stages):
        raise ValueError(f"hift base_channels {base} must be divisible by {2**n_stages}")
    stft_ch = HIFT_ISTFT_N_FFT + 2
    specs: list[ParamSpec] = _linear("m_source.l_linear", 1, HIFT_NB_HARMONICS + 1)
    specs += _wn_conv("conv_pre", base, MEL, HIFT_CONV_PRE_KERNEL)
    for i, k in enumerate(HIFT_UPSAMPLE_KERNELS):
        specs += _wn_conv(f"ups.{i}", base // 2 ** (i + 1), base // 2**i, k)
    # Source downsampling: cumulative rates of the reversed upsampling (15, 3, 1) -> kernel 2u, stride u.
    rates = [1, *HIFT_UPSAMPLE_RATES[::-1][:-1]]
    cum = [math.prod(rates[: j + 1]) for j in range(len(rates))][::-1]
    for i, u in enumerate(cum):
        specs += _conv(f"source_downs.{i}", base // 2 ** (i + 1), stft_ch, 1 if u == 1 else 2 * u)
    for i, k in enumerate(HIFT_SOURCE_RESBLOCK_KERNELS):
        specs += _resblock(f"source_resblocks.{i}", base // 2 ** (i + 1), k)
    for i in range(n_stages):
        for j, k in enumerate(HIFT_RESBLOCK_KERNELS):
            specs += _resblock(f"resblocks.{i * len(HIFT_RESBLOCK_KERNELS) + j}", base // 2 ** (i + 1), k)
    specs += _wn_conv("conv_post", stft_ch, base // 2**n_stages, 7)
    specs += _wn_conv("f0_predictor.condnet.0", s.f0_cond, MEL, 4)
    for j in range(1, F0_CONDNET_LAYERS):
        specs += _wn_conv(f"f0_predictor.condnet.{2 * j}", s.f0_cond, s.f0_cond, 3)
    specs += _linear("f0_predictor.classifier", 1, s.f0_cond)
    return specs


# ----------------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------------


def _draw_state_dict(specs: list[ParamSpec], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Draw every tensor in key order from ``gen``; g and tied entries are derived afterwards."""
    sd: dict[str, torch.Tensor] = {}
    for name, shape, kind in specs:
        # In-place scaling keeps one copy of each (possibly 0.5 GB) tensor in memory.
        if kind == MATRIX:
            fan_in = math.prod(shape[1:])
            sd[name] = torch.randn(shape, generator=gen).mul_(1.0 / math.sqrt(fan_in))
        elif kind == EMBEDDING:
            sd[name] = torch.randn(shape, generator=gen)
        elif kind == BIAS:
            sd[name] = torch.randn(shape, generator=gen).mul_(0.02)
        elif kind == SCALE:
            sd[name] = torch.randn(shape, generator=gen).mul_(0.1).add_(1.0)
        elif kind == INV_FREQ:
            (half,) = shape
            sd[name] = rope_inverse_frequencies(2 * half, 10000.0)
        elif kind in (WN_G, TIED):
            sd[name] = torch.empty(0)  # placeholder keeps the key order
        else:  # pragma: no cover - specs are built above
            raise ValueError(kind)
    for name, shape, kind in specs:
        if kind == WN_G:
            v = sd[name[: -len("original0")] + "original1"]
            # float64 norm: the float32 result does not depend on reduction order / thread count.
            sd[name] = v.double().flatten(1).pow(2).sum(dim=1).sqrt().float().reshape(shape)
        elif kind == TIED:
            sd[name] = sd["llm.model.model.embed_tokens.weight"]  # same storage, saved once
    return sd


def _adjust_llm(sd: dict[str, torch.Tensor]) -> None:
    sd["llm_decoder.weight"].mul_(4.0)  # logits ~ N(0, 16): greedy decoding has clear winners


def _adjust_hift(sd: dict[str, torch.Tensor]) -> None:
    sd["f0_predictor.classifier.weight"].mul_(60.0)  # f0 = |classifier(h)|: most frames voiced
    sd["f0_predictor.classifier.bias"].zero_()
    sd["conv_post.parametrizations.weight.original0"].mul_(0.3)
    sd["conv_post.bias"][: HIFT_ISTFT_N_FFT // 2 + 1] -= 0.5  # log-magnitude channels: quieter output


# ----------------------------------------------------------------------------------------------------
# ONNX front-end stand-ins (reference/README.md §2.4 I/O contract)
# ----------------------------------------------------------------------------------------------------

FSQ_DIMS = 8
FSQ_LEVELS = 3


class StandInCampplus(nn.Module):
    """``input`` [B, T, 80] -> ``output`` [B, 192]: conv-relu ×2, mean+std pooling over time, linear."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(MEL, channels, 3, padding=1)
        self.conv2 = nn.Conv1d(channels, channels, 3, padding=1)
        self.proj = nn.Linear(2 * channels, SPK_EMBED)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(feats.transpose(1, 2)))
        h = torch.relu(self.conv2(h))
        mean = h.mean(dim=2)
        std = ((h - mean.unsqueeze(2)) ** 2).mean(dim=2).clamp_min(1e-8).sqrt()
        return self.proj(torch.cat([mean, std], dim=1))


class StandInSpeechTokenizer(nn.Module):
    """``feats`` [B, 128, T] + ``feats_length`` int32 [B] -> ``indices`` int32 [B, ceil(ceil(T/2)/2)].

    The valid frames' time mean is removed first (so codes follow the signal's dynamics), then two
    k3/s2 convolutions give 25 Hz, then FSQ: code = Σ_i (round(0.999·tanh z_i) + 1)·3^i.
    """

    def __init__(self, channels: int = 32, gain: float = 12.0) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(128, channels, 3, stride=2, padding=1)
        self.conv2 = nn.Conv1d(channels, FSQ_DIMS, 3, stride=2, padding=1)
        self.gain = gain
        self.register_buffer("powers", (FSQ_LEVELS ** torch.arange(FSQ_DIMS, dtype=torch.float32)).reshape(1, -1, 1))

    def forward(self, feats: torch.Tensor, feats_length: torch.Tensor) -> torch.Tensor:
        frames = torch.arange(feats.shape[2], device=feats.device).unsqueeze(0)
        valid = (frames < feats_length.to(torch.int64).unsqueeze(1)).to(feats.dtype).unsqueeze(1)
        mean = (feats * valid).sum(dim=2, keepdim=True) / valid.sum(dim=2, keepdim=True).clamp_min(1.0)
        x = (feats - mean) * valid
        z = self.conv2(torch.nn.functional.gelu(self.conv1(x))) * self.gain
        levels = torch.round(0.999 * torch.tanh(z)) + 1.0
        return (levels * self.powers).sum(dim=1).to(torch.int32)


def _init_module(module: nn.Module, gen: torch.Generator) -> None:
    """Seeded init in parameter order: weights N(0, 1/fan_in), biases N(0, 0.02²)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(math.prod(p.shape[1:])))


def _export_onnx(module: nn.Module, args: tuple, path: Path, inputs: list[str], outputs: list[str], axes: dict) -> None:
    module.eval()
    buffer = io.BytesIO()
    # The TorchScript exporter is deterministic and gives the plain graphs the official files have;
    # torch warns that it is legacy.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(
            module, args, buffer, input_names=inputs, output_names=outputs, dynamic_axes=axes,
            opset_version=17, do_constant_folding=True, dynamo=False,
        )  # fmt: skip
    path.write_bytes(buffer.getvalue())


def write_frontend_onnx(out_dir: Path, seed: int) -> None:
    """campplus.onnx and speech_tokenizer_v3.onnx stand-ins (opset 17)."""
    campplus = StandInCampplus()
    _init_module(campplus, torch.Generator().manual_seed(seed * 1000 + 3))
    _export_onnx(
        campplus, (torch.zeros(1, 50, MEL),), out_dir / "campplus.onnx", ["input"], ["output"],
        {"input": {0: "B", 1: "T"}, "output": {0: "B"}},
    )  # fmt: skip
    tokenizer = StandInSpeechTokenizer()
    _init_module(tokenizer, torch.Generator().manual_seed(seed * 1000 + 4))
    _export_onnx(
        tokenizer, (torch.zeros(1, 128, 100), torch.tensor([100], dtype=torch.int32)),
        out_dir / "speech_tokenizer_v3.onnx", ["feats", "feats_length"], ["indices"],
        {"feats": {0: "B", 2: "T"}, "feats_length": {0: "B"}, "indices": {0: "B", 1: "T_out"}},
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# CosyVoice-BlankEN (Qwen2 config + small byte-level BPE)
# ----------------------------------------------------------------------------------------------------

BPE_LEARNED_ENTRIES = 640  # 256 byte symbols + 384 merges, as in the reference tiny model

# Small built-in training text (en + zh); it does not contain the golden test sentences.
_BPE_CORPUS = """\
The weather was calm this morning, and the river reflected a pale blue sky.
She opened the window and listened to the birds singing in the garden.
We walked along the quiet street, talking about books, music and old friends.
In the evening the city lights came on one by one, like a slow wave of stars.
Please remember to bring your notebook, a pencil and a bottle of water.
He said that the train would arrive at the station a little after nine.
Learning a new language takes patience, practice and a lot of curiosity.
The children played in the park until their parents called them home for dinner.
It is important to speak clearly and slowly when you record your voice.
Thank you very much for your help; I really appreciate your kindness.
What time is it now? Is there anything else you would like to know?
They built a small wooden house near the lake and painted it green.
This is a simple sentence for testing the tokenizer with English words.
Numbers such as 1, 2, 3, 10, 100 and 2024 appear in many texts.
今天的天气很好，我们一起去公园散步吧。
他每天早上都会喝一杯热茶，然后开始工作。
这本书讲述了一个关于友谊和勇气的故事。
请大家注意安全，按照顺序排队上车。
我们的城市正在发生很大的变化，新的建筑越来越多。
学习一门新的语言需要耐心和坚持。
晚上的时候，街道上的灯光非常美丽。
谢谢你的帮助，我真的非常感激。
孩子们在操场上快乐地玩耍，笑声传得很远。
春天来了，花园里开满了各种各样的花。
"""


def _bytes_to_unicode() -> list[tuple[int, str]]:
    """GPT-2 byte-level alphabet as (byte, symbol) in vocabulary order (printable bytes first)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    pairs = [(b, chr(b)) for b in printable]
    extra = 0
    for b in range(256):
        if b not in printable:
            pairs.append((b, chr(256 + extra)))
            extra += 1
    return pairs


def train_byte_bpe(text: str, learned_entries: int = BPE_LEARNED_ENTRIES) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Deterministic byte-level BPE: most frequent pair first, ties broken by the pair's strings.

    Words come from the Qwen2 pre-tokenizer (regex split + byte-level mapping), so the merges are
    usable by the Qwen2 tokenizer. Returns (vocab, merges) with ``learned_entries`` vocab entries
    (fewer if the text runs out of pairs).
    """
    from tokenizers import Regex, pre_tokenizers

    from .tokenizer import QWEN2_SPLIT_REGEX

    pre = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    words: Counter[tuple[str, ...]] = Counter()
    for line in text.splitlines(keepends=True):
        for piece, _ in pre.pre_tokenize_str(line):
            words[tuple(piece)] += 1
    vocab = {symbol: i for i, (_, symbol) in enumerate(_bytes_to_unicode())}
    merges: list[tuple[str, str]] = []
    while len(vocab) < learned_entries:
        pair_counts: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for a, b in zip(word, word[1:]):
                pair_counts[(a, b)] += count
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda p: (-pair_counts[p], p))
        merges.append(best)
        merged = best[0] + best[1]
        if merged not in vocab:
            vocab[merged] = len(vocab)
        new_words: Counter[tuple[str, ...]] = Counter()
        for word, count in words.items():
            out: list[str] = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    out.append(merged)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            new_words[tuple(out)] += count
        words = new_words
    return vocab, merges


def _qwen2_config(s: ModelSizes) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": BASE_VOCAB,
        "eos_token_id": BASE_VOCAB,
        "hidden_act": "silu",
        "hidden_size": s.llm_hidden,
        "initializer_range": 0.02,
        "intermediate_size": s.llm_intermediate,
        "max_position_embeddings": 32768,
        "max_window_layers": s.llm_layers,
        "model_type": "qwen2",
        "num_attention_heads": s.llm_heads,
        "num_hidden_layers": s.llm_layers,
        "num_key_value_heads": s.llm_kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1",
        "use_cache": True,
        "use_mrope": False,
        "use_sliding_window": False,
        "vocab_size": TEXT_VOCAB,
    }


_GENERATION_CONFIG = {
    "bos_token_id": BASE_VOCAB,
    "do_sample": False,
    "eos_token_id": BASE_VOCAB,
    "max_new_tokens": 2048,
    "transformers_version": "4.40.1",
}


def _tokenizer_config() -> dict:
    added = {}
    for offset, content in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]):
        added[str(BASE_VOCAB + offset)] = {
            "content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }  # fmt: skip
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _write_json(path: Path, data: dict, indent: int | None = 2) -> None:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=indent) + "\n", encoding="utf-8")


def write_blanken(out_dir: Path, s: ModelSizes) -> None:
    """CosyVoice-BlankEN/ without model.safetensors (llm.pt overwrites it; nothing of ours reads it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab, merges = train_byte_bpe(_BPE_CORPUS)
    for filler_id in range(len(vocab), BASE_VOCAB):
        vocab[f"\u2581{filler_id}"] = filler_id  # unreachable: byte-level text never contains U+2581
    (out_dir / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    _write_json(out_dir / "config.json", _qwen2_config(s))
    _write_json(out_dir / "generation_config.json", _GENERATION_CONFIG)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config())


# ----------------------------------------------------------------------------------------------------
# cosyvoice3.yaml
# ----------------------------------------------------------------------------------------------------

# examples/libritts/cosyvoice3/conf/cosyvoice3.yaml layout, with the sizes (and sampling) as fields.
_YAML_TEMPLATE = """\
# set random seed, so that you may reproduce your result.
__set_seed1: !apply:random.seed [1986]
__set_seed2: !apply:numpy.random.seed [1986]
__set_seed3: !apply:torch.manual_seed [1986]
__set_seed4: !apply:torch.cuda.manual_seed_all [1986]

# fixed params
sample_rate: 24000
llm_input_size: {llm_hidden}
llm_output_size: {llm_hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2

# stream related params
chunk_size: 25 # streaming inference chunk size, in token
num_decoding_left_chunks: -1 # streaming inference flow decoder left chunk size, <0 means use all left chunks

# model params
# for all class/function included in this repo, we use !<name> or !<new> for intialization, so that user may find all corresponding class/function according to one single yaml.
# for system/third_party class/function, we do not require this.
llm: !new:cosyvoice.llm.llm.CosyVoice3LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: {top_k}
        win_size: 10
        tau_r: {tau_r}

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {pre_lookahead_channels}
        pre_lookahead_len: 3
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dit_dim}
            depth: {dit_depth}
            heads: {dit_heads}
            dim_head: {dit_dim_head}
            ff_mult: 2
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: !ref <chunk_size> * <token_mel_ratio>
            num_decoding_left_chunks: !ref <num_decoding_left_chunks>

hift: !new:cosyvoice.hifigan.generator.CausalHiFTGenerator
    in_channels: 80
    base_channels: {hift_base}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    conv_pre_look_right: 4
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {f0_cond}

# gan related module
mel_spec_transform1: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: null
    center: False
hifigan: !new:cosyvoice.hifigan.hifigan.HiFiGan
    generator: !ref <hift>
    discriminator: !new:cosyvoice.hifigan.discriminator.MultipleDiscriminator
        mpd: !new:matcha.hifigan.models.MultiPeriodDiscriminator
        mrd: !new:cosyvoice.hifigan.discriminator.MultiResSpecDiscriminator
    mel_spec_transform: [
        !ref <mel_spec_transform1>
    ]

# processor functions
parquet_opener: !name:cosyvoice.dataset.processor.parquet_opener
get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
    version: cosyvoice3
allowed_special: 'all'
tokenize: !name:cosyvoice.dataset.processor.tokenize
    get_tokenizer: !ref <get_tokenizer>
    allowed_special: !ref <allowed_special>
filter: !name:cosyvoice.dataset.processor.filter
    max_length: 6000
    min_length: 100
    token_max_length: 200
    token_min_length: 1
resample: !name:cosyvoice.dataset.processor.resample
    resample_rate: !ref <sample_rate>
truncate: !name:cosyvoice.dataset.processor.truncate
    truncate_length: 24960 # must be a multiplier of hop_size and token_mel_ratio
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: null
    center: False
compute_fbank: !name:cosyvoice.dataset.processor.compute_fbank
    feat_extractor: !ref <feat_extractor>
    num_frames: 960
compute_whisper_fbank: !name:cosyvoice.dataset.processor.compute_whisper_fbank
    num_frames: 960
compute_f0: !name:cosyvoice.dataset.processor.compute_f0
    sample_rate: !ref <sample_rate>
    hop_size: 480
parse_embedding: !name:cosyvoice.dataset.processor.parse_embedding
    normalize: True
shuffle: !name:cosyvoice.dataset.processor.shuffle
    shuffle_size: 1000
sort: !name:cosyvoice.dataset.processor.sort
    sort_size: 500  # sort_size should be less than shuffle_size
batch: !name:cosyvoice.dataset.processor.batch
    batch_type: 'dynamic'
    max_frames_in_batch: 2000
padding: !name:cosyvoice.dataset.processor.padding
    use_spk_embedding: False # change to True during sft


# dataset processor pipeline
data_pipeline: [
    !ref <parquet_opener>,
    !ref <tokenize>,
    !ref <filter>,
    !ref <resample>,
    !ref <compute_fbank>,
    !ref <parse_embedding>,
    !ref <compute_whisper_fbank>,
    !ref <shuffle>,
    !ref <sort>,
    !ref <batch>,
    !ref <padding>,
]
data_pipeline_gan: [
    !ref <parquet_opener>,
    !ref <tokenize>,
    !ref <filter>,
    !ref <resample>,
    !ref <truncate>,
    !ref <compute_fbank>,
    !ref <compute_f0>,
    !ref <parse_embedding>,
    !ref <shuffle>,
    !ref <sort>,
    !ref <batch>,
    !ref <padding>,
]

# llm flow train conf
train_conf:
    optim: adam
    optim_conf:
        lr: 1e-5 # change to 1e-5 during sft
    scheduler: constantlr # change to constantlr during sft
    scheduler_conf:
        warmup_steps: 2500
    max_epoch: 200
    grad_clip: 5
    accum_grad: 2
    log_interval: 100
    save_per_step: -1

# gan train conf
train_conf_gan:
    optim: adam
    optim_conf:
        lr: 0.0002 # use small lr for gan training
    scheduler: constantlr
    optim_d: adam
    optim_conf_d:
        lr: 0.0002 # use small lr for gan training
    scheduler_d: constantlr
    max_epoch: 200
    grad_clip: 5
    accum_grad: 1 # in gan training, accum_grad must be 1
    log_interval: 100
    save_per_step: -1
"""


def render_yaml(s: ModelSizes, size_name: str, seed: int, greedy: bool = False) -> str:
    """The official yaml with our sizes; ``greedy`` sets top_k 1 / tau_r 2.0 like the reference tiny."""
    header = (
        f"# RANDOM-WEIGHT CosyVoice3 model written by cosy_export.random_model (size={size_name}, seed={seed}).\n"
        "# The official examples/libritts/cosyvoice3/conf/cosyvoice3.yaml with the model sizes substituted"
        + (" and greedy sampling (top_k 1, tau_r 2.0)" if greedy else "") + ".\n"
    )  # fmt: skip
    return header + _YAML_TEMPLATE.format(
        llm_hidden=s.llm_hidden, top_k=1 if greedy else 25, tau_r=2.0 if greedy else 0.1,
        pre_lookahead_channels=s.pre_lookahead_channels, dit_dim=s.dit_dim, dit_depth=s.dit_depth,
        dit_heads=s.dit_heads, dit_dim_head=s.dit_dim_head, hift_base=s.hift_base, f0_cond=s.f0_cond,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------
# Entry point
# ----------------------------------------------------------------------------------------------------


def write_random_model(out_dir: str | Path, size: str = "tiny", seed: int = 0, greedy: bool = False) -> Path:
    """Write a random CosyVoice3 model folder in the official layout; returns its path.

    ``size`` is "tiny" (a few MB, reference-tiny dimensions) or "full" (released dimensions, ~3.4 GB).
    """
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    if seed < 0:
        raise ValueError("seed must be non-negative")
    sizes = SIZES[size]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cosyvoice3.yaml").write_text(render_yaml(sizes, size, seed, greedy), encoding="utf-8")
    for offset, (name, specs, adjust) in enumerate(
        [("llm", llm_param_shapes(sizes), _adjust_llm), ("flow", flow_param_shapes(sizes), None),
         ("hift", hift_param_shapes(sizes), _adjust_hift)]  # fmt: skip
    ):
        sd = _draw_state_dict(specs, torch.Generator().manual_seed(seed * 1000 + offset))
        if adjust is not None:
            adjust(sd)
        torch.save(sd, out / f"{name}.pt")
        del sd  # one state dict in memory at a time (full llm.pt is ~2 GB)
    write_frontend_onnx(out, seed)
    write_blanken(out / "CosyVoice-BlankEN", sizes)
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse
    import time

    parser = argparse.ArgumentParser(description="Write a random-weight CosyVoice3 model folder (official layout).")
    parser.add_argument("out_dir")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--greedy", action="store_true", help="top_k 1 / tau_r 2.0 in the yaml")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = write_random_model(args.out_dir, args.size, args.seed, args.greedy)
    total = 0
    for path in sorted(out.rglob("*")):
        if path.is_file():
            total += path.stat().st_size
            print(f"{path.stat().st_size:>14,d}  {path.relative_to(out)}")
    print(f"{total:>14,d}  total, {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

"""Construction-time noise of the official model, reproduced without the official code
(cosyvoice3.md §5.6, §6.3, §11).

* Flow noise: `torch.manual_seed(0); torch.randn(1, 80, 15000)` on the CPU in float32 (drawn in
  `CausalConditionalCFM.__init__` right after `set_all_random_seed(0)`).
* HiFT sine noise: `torch.rand(1, 7_200_000, 9)` drawn later from the same generator, after the
  draws of every parameter initialised in between. We replay it by discarding K outputs of the
  mt19937 stream; K is computed from the yaml in document (construction) order.

The sine noise is uniform: each float32 is (mt19937 output & 0xFFFFFF) / 2^24, flat index
sample·9 + harmonic. The runtime may regenerate it from (seed 0, offset K) instead of a 259 MB file.
"""

from __future__ import annotations

from typing import Any

import torch

from .yamlcfg import CLASS_KEY, ConfigError, ModelConfig, new_objects

NOISE_MELS = 80
NOISE_FRAMES = 15000  # 300 s at 50 Hz, fixed in the official code
SINE_ROWS = 7_200_000  # 300 s at 24 kHz
SINE_WIDTH = 9  # fixed in the official code (not nb_harmonics + 1 from the yaml)
RAND_NOISE_DRAWS = NOISE_MELS * NOISE_FRAMES


def flow_noise() -> torch.Tensor:
    """float32 [80, 15000]: the official `rand_noise` (seed 0, CPU, float32)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    return torch.randn(1, NOISE_MELS, NOISE_FRAMES, generator=gen, dtype=torch.float32)[0]


def _normal_draws(numel: int) -> int:
    """mt19937 outputs consumed by a float32 CPU normal_ on a contiguous tensor: one per element
    when numel >= 16, plus 16 when numel is not a multiple of 16 (§11)."""
    if numel < 16:
        raise ConfigError(f"normal draw of {numel} < 16 elements uses another kernel; not supported")
    return numel + (16 if numel % 16 else 0)


def _linear_draws(fan_in: int, fan_out: int, bias: bool = True) -> int:
    """kaiming_uniform_ on the weight + uniform_ on the bias: one output per element."""
    return fan_out * fan_in + (fan_out if bias else 0)


def _conv_draws(c_in: int, c_out: int, kernel: int) -> int:
    return c_out * c_in * kernel + c_out


def _int(node: dict[str, Any], key: str, where: str) -> int:
    if key not in node:
        raise ConfigError(f"cosyvoice3.yaml: missing key {where}.{key} needed for the noise replay")
    value = node[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"cosyvoice3.yaml: {where}.{key} should be an integer, got {value!r}")
    return value


def _draws_of(path: str, cls: str, node: dict[str, Any], raw: dict[str, Any]) -> int:
    """Generator outputs consumed while constructing one `!new:` object after the reset (only the
    classes that appear in the official yaml after CausalConditionalCFM)."""
    name = cls.rsplit(".", 1)[-1]
    if name == "CausalMaskedDiffWithDiT":
        v, i = _int(node, "vocab_size", path), _int(node, "input_size", path)
        s, o = _int(node, "spk_embed_dim", path), _int(node, "output_size", path)
        return _normal_draws(v * i) + _linear_draws(s, o)
    if name == "CausalConvRNNF0Predictor":
        c, f = _int(node, "cond_channels", path), _int(node, "in_channels", path)
        n = _int(node, "num_class", path)
        return _conv_draws(f, c, 4) + 4 * _conv_draws(c, c, 3) + _linear_draws(c, n)
    if name == "PreLookaheadLayer":  # only when the yaml lists it after the decoder
        c_in, ch = _int(node, "in_channels", path), _int(node, "channels", path)
        look = _int(node, "pre_lookahead_len", path)
        return _conv_draws(c_in, ch, look + 1) + _conv_draws(ch, c_in, 3)
    raise ConfigError(
        f"cosyvoice3.yaml: {path} ({cls}) is constructed between the flow noise and the HiFT sine noise; "
        "its random draws are unknown to the replay"
    )


def sine_noise_offset(config: ModelConfig | dict[str, Any]) -> int:
    """K = mt19937 outputs consumed between `manual_seed(0)` and the `sine_waves` draw (§11).

    Walks the `!new:` objects in construction order from the CausalConditionalCFM (whose
    constructor reseeds and draws the flow noise) to the CausalHiFTGenerator; the HiFT generator
    itself draws its f0 predictor's parameters (a nested argument, built before it), then rand_ini
    [1, 9], then sine_waves.
    """
    raw = config.raw if isinstance(config, ModelConfig) else config
    objects = new_objects(raw)
    names = [cls.rsplit(".", 1)[-1] for _, cls, _ in objects]
    if "CausalConditionalCFM" not in names:
        raise ConfigError("cosyvoice3.yaml: no CausalConditionalCFM; the flow-noise reset point is unknown")
    if "CausalHiFTGenerator" not in names:
        raise ConfigError("cosyvoice3.yaml: no CausalHiFTGenerator")
    start = names.index("CausalConditionalCFM")
    end = names.index("CausalHiFTGenerator")
    if end < start:
        raise ConfigError("cosyvoice3.yaml: hift is built before the flow decoder; the replay needs the official order")
    hift = objects[end][2]
    if _int(hift, "sampling_rate", "hift") == 22050:
        raise ConfigError("cosyvoice3.yaml: hift.sampling_rate 22050 selects SineGen, not the causal SineGen2")
    k = RAND_NOISE_DRAWS
    for path, cls, node in objects[start + 1 : end]:
        if cls.rsplit(".", 1)[-1] == "DictConfig":
            continue
        k += _draws_of(path, cls, node, raw)
    return k + SINE_WIDTH  # rand_ini [1, 9]


def sine_noise(k_offset: int, n_rows: int = SINE_ROWS) -> torch.Tensor:
    """float32 [n_rows, 9]: rows 0..n_rows-1 of the official `sine_waves`, by replaying torch's CPU
    generator: manual_seed(0), discard `k_offset` float32 uniform draws, then draw."""
    if not 0 <= n_rows <= SINE_ROWS:
        raise ValueError(f"n_rows must be in [0, {SINE_ROWS}], got {n_rows}")
    gen = torch.Generator(device="cpu").manual_seed(0)
    remaining = k_offset
    chunk = 1 << 24
    while remaining > 0:  # float32 rand consumes exactly one output per element
        step = min(remaining, chunk)
        torch.rand(step, generator=gen, dtype=torch.float32)
        remaining -= step
    return torch.rand(n_rows * SINE_WIDTH, generator=gen, dtype=torch.float32).reshape(n_rows, SINE_WIDTH)


def official_full_size_raw() -> dict[str, Any]:
    """The `!new:` skeleton of the official full-size yaml (for checks; only the sizes the replay
    reads)."""
    return {
        "llm": {CLASS_KEY: "cosyvoice.llm.llm.CosyVoice3LM", "llm": {CLASS_KEY: "cosyvoice.llm.llm.Qwen2Encoder"}},
        "flow": {
            CLASS_KEY: "cosyvoice.flow.flow.CausalMaskedDiffWithDiT",
            "input_size": 80, "output_size": 80, "spk_embed_dim": 192, "vocab_size": 6561,
            "pre_lookahead_layer": {CLASS_KEY: "cosyvoice.transformer.upsample_encoder.PreLookaheadLayer", "channels": 1024},
            "decoder": {
                CLASS_KEY: "cosyvoice.flow.flow_matching.CausalConditionalCFM",
                "cfm_params": {CLASS_KEY: "omegaconf.DictConfig"},
                "estimator": {CLASS_KEY: "cosyvoice.flow.DiT.dit.DiT", "dim": 1024},
            },
        },
        "hift": {
            CLASS_KEY: "cosyvoice.hifigan.generator.CausalHiFTGenerator", "sampling_rate": 24000,
            "f0_predictor": {CLASS_KEY: "cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor",
                             "num_class": 1, "in_channels": 80, "cond_channels": 512},
        },
    }

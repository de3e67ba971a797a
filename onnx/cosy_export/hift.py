"""HiFT vocoder (CosyVoice3 `CausalHiFTGenerator`) for inference, our own implementation.

The module holds plain convolution weights (weight norm folded at load time) under the same key
names as the official `hift.pt` after folding, so loading is strict. It reproduces the official
`CausalHiFTGenerator.inference` (cosyvoice3.md §6):

* f0 predictor in float64 (three frames of right context, zero-padded on a final call);
* causal NSF source (SineGen2, sample-and-hold phase, uniform construction-time noise that the
  caller passes in as a tensor);
* `decode`: source STFT, conv stack, iSTFT, clamp. It has two interchangeable DFT back-ends:
  `"fft"` (torch.stft / torch.istft, as the official code) and `"conv"` (fixed DFT x window
  convolutions, the form exported to ONNX as the `hift_decode` graph of docs/model-format.md).

Lengths (T mel frames): a final call emits 480*T samples; a non-final call holds back 3 frames of
f0 context and 4 of conv_pre context and trims 480 more samples, emitting 480*(T-8).
"""

from __future__ import annotations

import math
from fractions import Fraction
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DftMode = Literal["fft", "conv"]

# Width of the official uniform noise buffer (`SineGen2.sine_waves`, [1, 7_200_000, 9]); fixed in
# the official code whatever nb_harmonics says.
SINE_NOISE_WIDTH = 9
# Right context of the f0 predictor's first conv (k=4, causal_type='right').
F0_LOOK_RIGHT = 3
# iSTFT magnitude clip and Snake's division guard, as in the official code.
MAG_CLIP = 1e2
SNAKE_EPS = 1e-9
FINAL_LRELU_SLOPE = 0.01  # F.leaky_relu default, used after the last stage
CONV_POST_KERNEL = 7


# --------------------------------------------------------------------------------------------
# configuration


@dataclass(frozen=True)
class F0PredictorConfig:
    num_class: int = 1
    in_channels: int = 80
    cond_channels: int = 512


@dataclass(frozen=True)
class HiftConfig:
    """`hift:` block of cosyvoice3.yaml; field names are the yaml keys."""

    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_params: Mapping[str, int] = field(default_factory=lambda: {"n_fft": 16, "hop_len": 4})
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    conv_pre_look_right: int = 4
    f0_predictor: F0PredictorConfig = field(default_factory=F0PredictorConfig)

    @classmethod
    def from_yaml(cls, d: Mapping[str, Any]) -> "HiftConfig":
        """Build from the yaml `hift` dict (as returned by yamlcfg: `!new:` objects are dicts with a
        `__class__` entry). Unknown keys are an error, so a changed yaml cannot pass silently."""
        d = dict(d)
        klass = d.pop("__class__", None)
        if klass is not None and not str(klass).endswith("CausalHiFTGenerator"):
            raise ValueError(f"hift: expected CausalHiFTGenerator, got {klass}")
        f0 = dict(d.pop("f0_predictor", {}))
        f0_class = f0.pop("__class__", None)
        if f0_class is not None and not str(f0_class).endswith("CausalConvRNNF0Predictor"):
            raise ValueError(f"hift.f0_predictor: expected CausalConvRNNF0Predictor, got {f0_class}")
        known = {f.name for f in cls.__dataclass_fields__.values()} - {"f0_predictor"}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"hift: unknown yaml keys {sorted(unknown)}")
        f0_unknown = set(f0) - set(F0PredictorConfig.__dataclass_fields__)
        if f0_unknown:
            raise ValueError(f"hift.f0_predictor: unknown yaml keys {sorted(f0_unknown)}")

        def ints(v: Any) -> tuple[int, ...]:
            return tuple(int(x) for x in v)

        kw: dict[str, Any] = {}
        for name, value in d.items():
            if name in ("upsample_rates", "upsample_kernel_sizes", "resblock_kernel_sizes",
                        "source_resblock_kernel_sizes"):
                kw[name] = ints(value)
            elif name in ("resblock_dilation_sizes", "source_resblock_dilation_sizes"):
                kw[name] = tuple(ints(v) for v in value)
            elif name == "istft_params":
                kw[name] = {"n_fft": int(value["n_fft"]), "hop_len": int(value["hop_len"])}
            elif name in ("nsf_alpha", "nsf_sigma", "nsf_voiced_threshold", "lrelu_slope",
                          "audio_limit"):
                kw[name] = float(value)
            else:
                kw[name] = int(value)
        cfg = cls(**kw, f0_predictor=F0PredictorConfig(**{k: int(v) for k, v in f0.items()}))
        cfg.validate()
        return cfg

    # derived sizes -------------------------------------------------------------------------
    @property
    def n_fft(self) -> int:
        return int(self.istft_params["n_fft"])

    @property
    def hop(self) -> int:
        return int(self.istft_params["hop_len"])

    @property
    def upsample_total(self) -> int:
        """Conv-stack upsampling (mel frame -> STFT column): 120 for [8, 5, 3]."""
        return int(np.prod(self.upsample_rates))

    @property
    def samples_per_frame(self) -> int:
        return self.upsample_total * self.hop

    @property
    def n_harmonics_total(self) -> int:
        return self.nb_harmonics + 1

    def validate(self) -> None:
        if self.sampling_rate == 22050:
            raise ValueError("hift: sampling_rate 22050 selects SineGen (v1), not supported")
        if self.n_harmonics_total != SINE_NOISE_WIDTH:
            raise ValueError(f"hift: nb_harmonics must be {SINE_NOISE_WIDTH - 1} (noise buffer width)")
        n = len(self.upsample_rates)
        if not (len(self.upsample_kernel_sizes) == len(self.source_resblock_kernel_sizes)
                == len(self.source_resblock_dilation_sizes) == n):
            raise ValueError("hift: upsample / source resblock lists differ in length")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ValueError("hift: resblock kernel / dilation lists differ in length")
        if self.n_fft % 2 or self.n_fft % self.hop:
            raise ValueError("hift: n_fft must be even and a multiple of hop_len")
        if self.base_channels % (2 ** n):
            raise ValueError("hift: base_channels must be divisible by 2**len(upsample_rates)")

    def decode_left_context_frames(self) -> int:
        """Mel frames a windowed `hift_decode` call must include before the first frame it is
        asked for, so that its output from there on equals a whole-prefix call's.

        Every op of the decoder is causal except conv_pre, which only looks right, so an output
        sample depends on a bounded stretch of earlier input. This is an upper bound on that
        stretch: the left reach of every op, each at the rate it runs at, summed as if they were
        all in one chain (the source branch joins the main one, so the sum over-counts, never
        under-counts), rounded up to whole frames, plus one spare frame.
        """
        spf = self.samples_per_frame
        columns_per_frame = self.upsample_total  # source STFT columns per mel frame

        def resblock_reach(kernel: int, dilations: tuple[int, ...]) -> int:
            # per dilation d: a conv of dilation d, then one of dilation 1, both left-causal
            return (kernel - 1) * (sum(dilations) + len(dilations))

        reach = Fraction(self.n_fft // 2, spf)  # centred STFT of the source (reflect pad)
        rate = 1
        n_stages = len(self.upsample_rates)
        for i, (u, k) in enumerate(zip(self.upsample_rates, self.upsample_kernel_sizes)):
            rate *= u
            reach += Fraction(k - 1, rate)  # nearest upsample + left-causal conv
            if i == n_stages - 1:
                reach += Fraction(1, rate)  # ReflectionPad1d((1, 0))
            stride = int(np.prod(self.upsample_rates[i + 1:]))
            down_kernel = 1 if stride == 1 else 2 * stride
            reach += Fraction(down_kernel - 1, columns_per_frame)
            reach += Fraction(resblock_reach(self.source_resblock_kernel_sizes[i],
                                             self.source_resblock_dilation_sizes[i]), rate)
            reach += Fraction(max(resblock_reach(kr, dr) for kr, dr in
                                  zip(self.resblock_kernel_sizes, self.resblock_dilation_sizes)), rate)
        reach += Fraction(CONV_POST_KERNEL - 1, rate)
        reach += Fraction(self.n_fft, spf)  # iSTFT overlap-add
        return math.ceil(reach) + 1

    def manifest_config(self) -> dict[str, Any]:
        """The `config.hift` entry of manifest.json (docs/model-format.md)."""
        return {
            "base_channels": self.base_channels,
            "upsample_rates": list(self.upsample_rates),
            "istft_n_fft": self.n_fft,
            "istft_hop": self.hop,
            "nb_harmonics": self.nb_harmonics,
            "nsf_alpha": self.nsf_alpha,
            "nsf_sigma": self.nsf_sigma,
            "nsf_voiced_threshold": self.nsf_voiced_threshold,
            "audio_limit": self.audio_limit,
            "f0_cond_channels": self.f0_predictor.cond_channels,
            "conv_pre_look_right": self.conv_pre_look_right,
            "f0_look_right": F0_LOOK_RIGHT,
            "decode_left_context_frames": self.decode_left_context_frames(),
        }


# --------------------------------------------------------------------------------------------
# building blocks (plain convs; padding is explicit in forward so the kernel sizes stay as stored)


class Snake(nn.Module):
    """x + 1/(alpha + 1e-9) * sin(alpha * x)^2, per channel (alpha stored linearly).

    The square is written s * s: the same bits as the official `.pow(2)` (torch and ONNX Runtime
    both compute pow with exponent 2 as x * x), exported as an (Eigen-vectorised) `Mul` instead of
    a `Pow` node (a scalar loop in ONNX Runtime's CPU provider)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.alpha[None, :, None]
        s = torch.sin(x * a)
        return x + (1.0 / (a + SNAKE_EPS)) * (s * s)


def _left_conv(conv: nn.Conv1d, x: torch.Tensor) -> torch.Tensor:
    """Causal conv: (k-1)*dilation zeros on the left, stride 1, same length out."""
    pad = (conv.kernel_size[0] - 1) * conv.dilation[0]
    return conv(F.pad(x, (pad, 0)))


class PolyphaseUpsample(nn.Module):
    """Nearest x`rate` up-sampling followed by a left-causal conv (kernel k, stride 1), computed at
    the input rate: one left-causal conv with rate * C_out output channels and
    T = ceil((k - 1) / rate) + 1 taps, whose `rate` phases are then interleaved.

    Output sample t = rate*q + p of the original reads up-sampled samples t-k+1 .. t, i.e. input
    samples q - m with m = ceil((k - 1 - p - j) / rate) for weight tap j; so phase p's tap m is the
    sum of the (at most `rate`) original taps j that land on the same input sample. The sums are
    formed in float64 and rounded once. An output sample then costs T multiply-adds per input
    channel instead of k: 3 instead of 16, 11 and 7 for the official stages (rates [8, 5, 3],
    kernels (16, 11, 7)), i.e. 7.6 -> 2.0 GFLOP of the 67 GFLOP that `decode` spends on 100 frames
    at 512 channels. The zero left padding is the same (the up-sampled zeros before sample 0 are
    the input's zeros before sample 0), and so is the receptive field (taps beyond it are zero)."""

    def __init__(self, conv: nn.Conv1d, rate: int) -> None:
        super().__init__()
        if conv.stride[0] != 1 or conv.dilation[0] != 1 or conv.groups != 1:
            raise ValueError("PolyphaseUpsample: only stride 1, dilation 1, groups 1 convs")
        w = conv.weight.detach().to(torch.float64)
        c_out, c_in, k = w.shape
        self.rate = rate
        self.taps = -(-(k - 1) // rate) + 1
        poly = torch.zeros(c_out, rate, c_in, self.taps, dtype=torch.float64)
        for p in range(rate):
            for j in range(k):
                m = -(-(k - 1 - p - j) // rate)
                poly[:, p, :, self.taps - 1 - m] += w[:, :, j]
        self.weight = nn.Parameter(poly.reshape(c_out * rate, c_in, self.taps).to(conv.weight.dtype),
                                   requires_grad=False)
        bias = conv.bias.detach() if conv.bias is not None else torch.zeros(c_out, dtype=conv.weight.dtype)
        self.bias = nn.Parameter(bias.repeat_interleave(rate), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, _, length = x.shape
        z = F.conv1d(F.pad(x, (self.taps - 1, 0)), self.weight, self.bias)  # [B, C*rate, L]
        return z.reshape(b, -1, self.rate, length).transpose(2, 3).reshape(b, -1, length * self.rate)


class CausalResBlock(nn.Module):
    """Per dilation d: x += conv2(snake2(conv1_d(snake1(x)))), all convs left-causal."""

    def __init__(self, channels: int, kernel: int, dilations: tuple[int, ...]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(channels, channels, kernel, dilation=d) for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(channels, channels, kernel) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = x + _left_conv(c2, a2(_left_conv(c1, a1(x))))
        return x


class F0Predictor(nn.Module):
    """CausalConvRNNF0Predictor: condnet (conv k4 right-context 3, then 4x conv k3 causal, ELU after
    each) and a linear classifier; f0 = |classifier|. Module indices follow the official
    nn.Sequential (convs at 0, 2, 4, 6, 8) so the state-dict keys match. Meant to run in float64."""

    def __init__(self, cfg: F0PredictorConfig) -> None:
        super().__init__()
        c = cfg.cond_channels
        layers: list[nn.Module] = [nn.Conv1d(cfg.in_channels, c, F0_LOOK_RIGHT + 1), nn.ELU()]
        for _ in range(4):
            layers += [nn.Conv1d(c, c, 3), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(c, cfg.num_class)

    def forward(self, mel: torch.Tensor, finalize: bool) -> torch.Tensor:
        """mel [B, F, T] -> f0 [B, T] (finalize) or [B, T-3] (the last 3 frames are context)."""
        x = F.pad(mel, (0, F0_LOOK_RIGHT)) if finalize else mel
        x = self.condnet[1](self.condnet[0](x))
        for i in range(2, len(self.condnet), 2):
            x = self.condnet[i + 1](_left_conv(self.condnet[i], x))
        return torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))


class SourceModule(nn.Module):
    """SourceModuleHnNSF + SineGen2(causal=True): f0 -> harmonic source in [-1, 1].

    Op order is the official float32 one: fn/sr, mod 1, 1/480 linear down-sampling (picks each
    frame's constant value), cumsum, *2*pi, *480, nearest up-sampling, sin, *alpha. `rand_ini` is
    omitted: it only touches sample 0, which the down-sampling never reads.
    """

    def __init__(self, cfg: HiftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.l_linear = nn.Linear(cfg.n_harmonics_total, 1)
        self.register_buffer(
            "harmonics", torch.arange(1, cfg.n_harmonics_total + 1, dtype=torch.float32)[None, None, :],
            persistent=False)

    def forward(self, f0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """f0 [B, T] float32, noise [1, >= 480*T, 9] uniform [0, 1) -> source [B, 1, 480*T]."""
        cfg = self.cfg
        up = cfg.samples_per_frame
        n = f0.shape[1] * up
        if noise.shape[1] < n:
            raise ValueError(f"sine noise has {noise.shape[1]} rows, need {n}")
        f0_up = F.interpolate(f0[:, None, :], scale_factor=up, mode="nearest").transpose(1, 2)
        fn = f0_up * self.harmonics                                     # [B, L, 9]
        rad = (fn / cfg.sampling_rate) % 1
        rad = F.interpolate(rad.transpose(1, 2), scale_factor=1 / up, mode="linear").transpose(1, 2)
        phase = torch.cumsum(rad, dim=1) * 2 * np.pi
        phase = F.interpolate(phase.transpose(1, 2) * up, scale_factor=up, mode="nearest").transpose(1, 2)
        sines = torch.sin(phase) * cfg.nsf_alpha
        uv = (f0_up > cfg.nsf_voiced_threshold).to(torch.float32)
        noise_amp = uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3
        sig = sines * uv + noise_amp * noise[:, :n]
        return torch.tanh(self.l_linear(sig)).transpose(1, 2)


def _dft_kernels(n_fft: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(forward kernel [n_fft+2, 1, n_fft], inverse kernel [n_fft+2, 1, n_fft], window^2 [1, 1, n_fft])
    for a periodic Hann window (scipy `get_window('hann', n, fftbins=True)`), built in float64."""
    bins = n_fft // 2 + 1
    n = torch.arange(n_fft, dtype=torch.float64)
    k = torch.arange(bins, dtype=torch.float64)[:, None]
    window = 0.5 - 0.5 * torch.cos(2 * math.pi * n / n_fft)
    ang = 2 * math.pi * k * n / n_fft                                    # [bins, n_fft]
    fwd = torch.cat([torch.cos(ang), -torch.sin(ang)]) * window          # X_k = sum x w e^{-i..}
    # irfft: x[n] = 1/N sum_k c_k (Re X_k cos - Im X_k sin), c_k = 1 at DC/Nyquist, else 2
    ck = torch.full((bins, 1), 2.0, dtype=torch.float64)
    ck[0] = ck[-1] = 1.0
    inv = torch.cat([ck * torch.cos(ang), -ck * torch.sin(ang)]) / n_fft * window
    return fwd[:, None, :].float(), inv[:, None, :].float(), (window ** 2)[None, None, :].float()


class StftConv(nn.Module):
    """torch.stft(center=True, reflect, onesided, periodic Hann) as a fixed convolution:
    x [B, 1, L] -> [B, n_fft + 2, L/hop + 1] = [real bins; imag bins]."""

    def __init__(self, n_fft: int, hop: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("kernel", _dft_kernels(n_fft)[0], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = self.n_fft // 2
        return F.conv1d(F.pad(x, (pad, pad), mode="reflect"), self.kernel, stride=self.hop)


class IstftConv(nn.Module):
    """torch.istft(center=True, periodic Hann) as a fixed transposed convolution (overlap-add of
    the windowed inverse real DFT), divided by the overlap-added squared window, trimmed n_fft/2
    on each side: real, imag [B, n_fft/2+1, F] -> [B, hop*(F-1)]."""

    def __init__(self, n_fft: int, hop: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        _, inv, window_sq = _dft_kernels(n_fft)
        self.register_buffer("kernel", inv, persistent=False)
        self.register_buffer("window_sq", window_sq, persistent=False)

    def forward(self, real: torch.Tensor, imag: torch.Tensor) -> torch.Tensor:
        y = F.conv_transpose1d(torch.cat([real, imag], dim=1), self.kernel, stride=self.hop)
        env = F.conv_transpose1d(torch.ones_like(real[:, :1, :]), self.window_sq, stride=self.hop)
        pad = self.n_fft // 2
        return (y / env)[:, 0, pad:-pad]


# --------------------------------------------------------------------------------------------
# generator


class HiftGenerator(nn.Module):
    """CausalHiFTGenerator for inference, weight norm folded."""

    def __init__(self, cfg: HiftConfig) -> None:
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        base = cfg.base_channels
        spec_ch = cfg.n_fft + 2
        # The f0 predictor lives in float64 (official: "precision is crucial for causal inference").
        self.f0_predictor = F0Predictor(cfg.f0_predictor).to(torch.float64)
        self.m_source = SourceModule(cfg)
        self.conv_pre = nn.Conv1d(cfg.in_channels, base, cfg.conv_pre_look_right + 1)
        self.ups = nn.ModuleList(
            nn.Conv1d(base // 2 ** i, base // 2 ** (i + 1), k)
            for i, k in enumerate(cfg.upsample_kernel_sizes))
        # source branch i runs at the rate of stage i's output: down-sample by the product of the
        # later stages' rates (15, 3, 1 for [8, 5, 3]).
        self.source_strides: list[int] = [
            int(np.prod(cfg.upsample_rates[i + 1:])) for i in range(len(cfg.upsample_rates))]
        self.source_downs = nn.ModuleList(
            nn.Conv1d(spec_ch, base // 2 ** (i + 1), 1 if u == 1 else 2 * u, stride=u)
            for i, u in enumerate(self.source_strides))
        self.source_resblocks = nn.ModuleList(
            CausalResBlock(base // 2 ** (i + 1), k, d)
            for i, (k, d) in enumerate(zip(cfg.source_resblock_kernel_sizes,
                                           cfg.source_resblock_dilation_sizes)))
        self.resblocks = nn.ModuleList(
            CausalResBlock(base // 2 ** (i + 1), k, d)
            for i in range(len(cfg.upsample_rates))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        self.conv_post = nn.Conv1d(base // 2 ** len(cfg.upsample_rates), spec_ch, CONV_POST_KERNEL)
        self.stft_conv = StftConv(cfg.n_fft, cfg.hop)
        self.istft_conv = IstftConv(cfg.n_fft, cfg.hop)
        window = torch.from_numpy(0.5 - 0.5 * np.cos(2 * np.pi * np.arange(cfg.n_fft) / cfg.n_fft))
        self.register_buffer("stft_window", window.float(), persistent=False)

    # -- f0 and source ------------------------------------------------------------------------
    def predict_f0(self, mel: torch.Tensor, finalize: bool) -> torch.Tensor:
        """f0 in float64 (the predictor's parameters must be float64); returns float64."""
        return self.f0_predictor(mel.to(torch.float64), finalize)

    def source(self, f0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        return self.m_source(f0.to(torch.float32), noise)

    # -- decode -------------------------------------------------------------------------------
    def _stft(self, s: torch.Tensor, dft: DftMode) -> torch.Tensor:
        if dft == "conv":
            return self.stft_conv(s)
        spec = torch.stft(s[:, 0], self.cfg.n_fft, self.cfg.hop, self.cfg.n_fft, window=self.stft_window,
                          center=True, pad_mode="reflect", return_complex=True)
        spec = torch.view_as_real(spec)
        return torch.cat([spec[..., 0], spec[..., 1]], dim=1)

    def _istft(self, mag: torch.Tensor, phase: torch.Tensor, dft: DftMode) -> torch.Tensor:
        mag = torch.clip(mag, max=MAG_CLIP)
        real, imag = mag * torch.cos(phase), mag * torch.sin(phase)
        if dft == "conv":
            return self.istft_conv(real, imag)
        return torch.istft(torch.complex(real, imag), self.cfg.n_fft, self.cfg.hop, self.cfg.n_fft,
                           window=self.stft_window, center=True)

    def decode(self, mel: torch.Tensor, source: torch.Tensor, dft: DftMode = "fft",
               polyphase: nn.ModuleList | None = None) -> torch.Tensor:
        """The `hift_decode` graph: mel [B, 80, frames + 4] (4 frames of conv_pre right context,
        zeros on a final call), source [B, 1, 480*s] with s >= frames -> waveform [B, 480*frames],
        clamped. Only the first 120*frames + 1 source STFT columns are used. `polyphase`: one
        `PolyphaseUpsample` per stage in place of nearest up-sampling + `ups[i]` (the exported
        form; None: the official form)."""
        cfg = self.cfg
        frames = mel.shape[2] - cfg.conv_pre_look_right
        spec = self._stft(source, dft)[:, :, :cfg.upsample_total * frames + 1]
        x = self.conv_pre(mel)
        n_stages = len(cfg.upsample_rates)
        n_kernels = len(cfg.resblock_kernel_sizes)
        for i, (rate, up) in enumerate(zip(cfg.upsample_rates, self.ups)):
            x = F.leaky_relu(x, cfg.lrelu_slope)
            if polyphase is not None:
                x = polyphase[i](x)
            else:
                x = _left_conv(up, F.interpolate(x, scale_factor=rate, mode="nearest"))
            if i == n_stages - 1:
                x = torch.cat([x[:, :, 1:2], x], dim=2)  # ReflectionPad1d((1, 0))
            down = self.source_downs[i]
            stride = self.source_strides[i]
            si = down(F.pad(spec, (stride - 1, 0))) if stride > 1 else down(spec)
            x = x + self.source_resblocks[i](si)
            acc = self.resblocks[i * n_kernels](x)
            for j in range(1, n_kernels):
                acc = acc + self.resblocks[i * n_kernels + j](x)
            x = acc / n_kernels
        x = _left_conv(self.conv_post, F.leaky_relu(x, FINAL_LRELU_SLOPE))
        bins = cfg.n_fft // 2 + 1
        wav = self._istft(torch.exp(x[:, :bins]), torch.sin(x[:, bins:]), dft)
        return torch.clamp(wav, -cfg.audio_limit, cfg.audio_limit)

    # -- full inference -------------------------------------------------------------------------
    @torch.inference_mode()
    def inference(self, mel: torch.Tensor, noise: torch.Tensor, finalize: bool = True,
                  dft: DftMode = "fft") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Official `CausalHiFTGenerator.inference` on the whole accumulated mel [1, 80, T].

        Returns (waveform [1, 480*T] or [1, 480*(T-8)], source [1, 1, 480*T'], f0 [1, T'] float32)
        with T' = T on a final call, T - 3 otherwise.
        """
        look = self.cfg.conv_pre_look_right
        f0 = self.predict_f0(mel, finalize).to(mel.dtype)
        src = self.source(f0, noise)
        if finalize:
            wav = self.decode(F.pad(mel, (0, look)), src, dft)
        else:
            wav = self.decode(mel[:, :, :mel.shape[2] - F0_LOOK_RIGHT], src, dft)
            wav = wav[:, :wav.shape[1] - self.cfg.samples_per_frame]
        return wav, src, f0


# --------------------------------------------------------------------------------------------
# loading


def load_hift(path: Path | str, cfg: HiftConfig) -> HiftGenerator:
    """Build the generator from `cfg` and load `hift.pt` (a model directory or the file itself)
    strictly. Weight norm is folded (both key conventions); the f0 predictor's g and v are
    promoted to float64 before folding, as the official code folds them after `.to(float64)`."""
    from .checkpoint import fold_weight_norm, load_state_dict, match_state_dict, strip_prefix

    file = Path(path)
    if file.is_dir():
        file = file / "hift.pt"
    raw = strip_prefix(load_state_dict(file), "generator.")
    raw = {k: (v.to(torch.float64) if k.startswith("f0_predictor.") else v) for k, v in raw.items()}
    model = HiftGenerator(cfg)
    match_state_dict(model, fold_weight_norm(raw, file), file)
    return model.eval().requires_grad_(False)


# --------------------------------------------------------------------------------------------
# ONNX export


class HiftDecodeGraph(nn.Module):
    """`hift_decode` graph: (mel, source) -> waveform, DFTs as convolutions, up-sampling stages
    in polyphase form."""

    def __init__(self, model: HiftGenerator) -> None:
        super().__init__()
        self.model = model
        self.polyphase = nn.ModuleList(
            PolyphaseUpsample(up, rate) for up, rate in zip(model.ups, model.cfg.upsample_rates))

    def forward(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return self.model.decode(mel, source, dft="conv", polyphase=self.polyphase)


def _constant_values(model: Any, names: set[str]) -> dict[str, np.ndarray]:
    """Values of the tensors `names` that are computed from constants only (torch's `F.pad` export
    builds its `pads` input from a chain of Constant/ConstantOfShape/Concat/... nodes), evaluated
    with onnx's reference evaluator over their ancestors. Tensors that depend on a graph input are
    left out."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    producer = {o: n for n in graph.node for o in n.output}
    initializers = {i.name: i for i in graph.initializer}
    memo: dict[str, bool] = {}

    def constant(name: str) -> bool:
        if name == "" or name in initializers:
            return True
        if name not in memo:
            node = producer.get(name)
            memo[name] = node is not None and all(constant(i) for i in node.input)
        return memo[name]

    wanted = sorted(n for n in names if n not in initializers and constant(n))
    out = {n: onnx.numpy_helper.to_array(initializers[n]) for n in names if n in initializers}
    if not wanted:
        return out
    needed: set[str] = set()
    stack = list(wanted)
    while stack:
        node = producer.get(stack.pop())
        if node is not None and node.name not in needed:
            needed.add(node.name)
            stack.extend(i for i in node.input if i and i not in initializers)
    nodes = [n for n in graph.node if n.name in needed]
    used = {i for n in nodes for i in n.input}
    sub = onnx.helper.make_graph(
        nodes, "constants", [], [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.UNDEFINED, None)
                                 for n in wanted],
        [initializers[i] for i in sorted(used & set(initializers))])
    sub_model = onnx.helper.make_model(sub, opset_imports=model.opset_import, ir_version=model.ir_version)
    values = ReferenceEvaluator(sub_model).run(None, {})
    out.update(zip(wanted, (np.asarray(v) for v in values)))
    return out


def convs_as_2d(model: Any) -> Any:
    """Rewrites every 1-D `Conv` with a constant weight of the exported graph, in place:

    * a zero constant `Pad` of the time axis that feeds only the conv (the causal left pads,
      torch's `F.pad`) becomes the conv's own `pads` (ONNX Conv allows asymmetric pads), which
      saves a copy of the activation per conv and computes the same sums;
    * the conv becomes a 2-D conv over [B, C, 1, T] between an `Unsqueeze` and a `Squeeze`
      (kernel [1, k], weight [O, I, 1, k]). ONNX Runtime's CPU provider runs 2-D convs in its
      blocked NCHWc layout (MLAS direct convolution kernels, chosen by instruction set: AVX2,
      AVX-512F, ...), 1-D convs as im2col + SGEMM; on these shapes the NCHWc kernels do the same
      arithmetic in less time (docs/benchmarks.md). TensorRT and cuDNN run 1-D convs as 2-D ones
      anyway.

    Node names are kept (the new Unsqueeze/Squeeze take the conv's name plus a suffix), so scope
    based selections such as the fp16 keep-list still match."""
    import onnx
    from onnx import helper, numpy_helper

    graph = model.graph
    # Fixed kernels held in Constant nodes (the DFT buffers) become initializers first.
    for n in list(graph.node):
        if (n.op_type == "Constant" and len(n.attribute) == 1 and n.attribute[0].name == "value"
                and any(c.op_type == "Conv" and c.input[1] == n.output[0] for c in graph.node)):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(n.attribute[0].t)
            tensor.name = n.output[0]
            graph.initializer.append(tensor)
            graph.node.remove(n)
    initializers = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    outputs = {o.name for o in graph.output}

    def attr(node: Any, name: str, default: Any) -> Any:
        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def is_1d_conv(n: Any) -> bool:
        return (n.op_type == "Conv" and n.input[1] in initializers
                and len(initializers[n.input[1]].dims) == 3)

    convs = [n for n in graph.node if is_1d_conv(n)]
    pad_nodes = {}
    for conv in convs:
        pad = producer.get(conv.input[0])
        if (pad is not None and pad.op_type == "Pad" and attr(pad, "mode", b"constant") == b"constant"
                and len(consumers[conv.input[0]]) == 1 and conv.input[0] not in outputs):
            pad_nodes[conv.name] = pad
    wanted = {p.input[1] for p in pad_nodes.values()}
    wanted |= {p.input[2] for p in pad_nodes.values() if len(p.input) > 2 and p.input[2]}
    values = _constant_values(model, wanted)

    axis = "hift_time_axis_2"
    graph.initializer.append(numpy_helper.from_array(np.array([2], dtype=np.int64), axis))
    weight_users = {name: len(consumers.get(name, [])) for name in initializers}
    replaced: dict[str, list[Any]] = {}
    dropped: set[str] = set()
    for conv in convs:
        k = int(initializers[conv.input[1]].dims[2])
        pads = [int(v) for v in attr(conv, "pads", [0, 0])]
        x = conv.input[0]
        pad = pad_nodes.get(conv.name)
        if pad is not None and pad.input[1] in values:
            pv = values[pad.input[1]].astype(np.int64).reshape(-1)
            value = values.get(pad.input[2]) if len(pad.input) > 2 and pad.input[2] else np.zeros(1)
            if (value is not None and not np.any(value) and pv.size == 6 and (pv >= 0).all()
                    and not pv[[0, 1, 3, 4]].any()):
                pads = [pads[0] + int(pv[2]), pads[1] + int(pv[5])]
                x = pad.input[0]
                dropped.add(pad.name)
        weight = conv.input[1]
        if weight_users[weight] != 1:
            raise ValueError(f"convs_as_2d: weight {weight} is shared")
        w = numpy_helper.to_array(initializers[weight])
        initializers[weight].CopyFrom(numpy_helper.from_array(w[:, :, None, :], weight))
        x4, y4 = f"{conv.output[0]}_2d_in", f"{conv.output[0]}_2d"
        conv2d = helper.make_node(
            "Conv", [x4, *conv.input[1:]], [y4], name=conv.name,
            kernel_shape=[1, k], pads=[0, pads[0], 0, pads[1]],
            strides=[1, int(attr(conv, "strides", [1])[0])],
            dilations=[1, int(attr(conv, "dilations", [1])[0])], group=int(attr(conv, "group", 1)))
        replaced[conv.name] = [
            helper.make_node("Unsqueeze", [x, axis], [x4], name=f"{conv.name}_to_2d"),
            conv2d,
            helper.make_node("Squeeze", [y4, axis], [conv.output[0]], name=f"{conv.name}_from_2d"),
        ]
    nodes = []
    for n in graph.node:
        if n.name in dropped:
            continue
        nodes.extend(replaced.get(n.name, [n]))
    # drop what only fed the removed Pads (their pads chains)
    while True:
        used = {i for n in nodes for i in n.input} | outputs
        kept = [n for n in nodes if any(o in used for o in n.output)]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    kept_inits = [i for i in graph.initializer if i.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_inits)
    produced = {o for n in nodes for o in n.output}
    kept_info = [v for v in graph.value_info if v.name in produced]
    del graph.value_info[:]
    graph.value_info.extend(kept_info)
    onnx.checker.check_model(model)
    return model


def _file_entry(path: Path) -> dict[str, Any]:
    import hashlib

    data = path.read_bytes()
    return {"file": path.name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "data": None}


def export_hift_decode(model: HiftGenerator, out_path: Path | str, opset: int = 17,
                       opt_frames: int = 200, max_frames: int = 3000) -> dict[str, Any]:
    """Export the `hift_decode` graph (docs/model-format.md) to `out_path` (fp32) and return its
    manifest GRAPH entry with the fp32 variant filled in. `opt_frames`/`max_frames` only shape the
    suggested TensorRT profile (frames = mel columns - 4)."""
    import onnx

    out_path = Path(out_path)
    cfg = model.cfg
    look, spf = cfg.conv_pre_look_right, cfg.samples_per_frame
    example_frames = 12
    mel = torch.randn(1, cfg.in_channels, example_frames + look)
    source = torch.rand(1, 1, spf * (example_frames + look)) - 0.5
    graph = HiftDecodeGraph(model).eval()
    with torch.no_grad():
        torch.onnx.export(
            graph, (mel, source), str(out_path), dynamo=False, opset_version=opset,
            input_names=["mel", "source"], output_names=["waveform"],
            dynamic_axes={"mel": {2: "mel_frames"}, "source": {2: "source_samples"},
                          "waveform": {1: "samples"}},
            do_constant_folding=True)
    onnx.save(convs_as_2d(onnx.load(str(out_path))), str(out_path))

    def profile(frames: int, source_frames: int) -> tuple[list[int], list[int]]:
        return [1, cfg.in_channels, frames + look], [1, 1, spf * source_frames]

    lo, opt, hi = profile(1, 1), profile(opt_frames, opt_frames + look), profile(max_frames, max_frames + look)
    return {
        "inputs": [
            {"name": "mel", "dtype": "float32", "shape": [1, cfg.in_channels, "mel_frames"]},
            {"name": "source", "dtype": "float32", "shape": [1, 1, "source_samples"]},
        ],
        "outputs": [{"name": "waveform", "dtype": "float32", "shape": [1, "samples"]}],
        "variants": {"fp32": _file_entry(out_path)},
        "trt_profile": {
            "mel": {"min": lo[0], "opt": opt[0], "max": hi[0]},
            "source": {"min": lo[1], "opt": opt[1], "max": hi[1]},
        },
    }


# Graph scopes kept in float32 by the fp16 variant: the fixed STFT/iSTFT convolutions (reflect
# pad, DFT kernels, overlap-add and the window-envelope division).
FP16_FP32_SCOPES = ("/stft_conv/", "/istft_conv/")


def make_hift_decode_fp16(fp32_path: Path | str, out_path: Path | str) -> dict[str, Any]:
    """Write the fp16 variant of `hift_decode` (fp32 I/O, onnxconverter-common) and return its
    manifest variant entry. The conv stack, Snake, exp and sin run in fp16 (keeping exp/sin in
    fp32 measured no better); the STFT/iSTFT scopes stay fp32. On the tiny model the waveform moves
    by about 0.005-0.010 max-abs and 0.008-0.009 mean |delta log-mel| (compare.py tolerances:
    0.05 / 0.025)."""
    import onnx
    from onnxconverter_common import float16

    fp32 = onnx.load(str(fp32_path))
    keep = [n.name for n in fp32.graph.node if any(scope in n.name for scope in FP16_FP32_SCOPES)]
    if not keep:
        raise ValueError(f"{fp32_path}: no STFT/iSTFT nodes found (scopes {FP16_FP32_SCOPES})")
    fp16 = float16.convert_float_to_float16(fp32, keep_io_types=True, node_block_list=keep)
    onnx.checker.check_model(fp16)
    onnx.save(fp16, str(out_path))
    return _file_entry(Path(out_path))


# --------------------------------------------------------------------------------------------
# side.safetensors


def hift_side_tensors(model: HiftGenerator) -> dict[str, np.ndarray]:
    """Weights the runtime uses natively (docs/model-format.md, side.safetensors): the f0
    predictor in float64 (weight norm folded in float64) and the source's l_linear in float32."""
    out: dict[str, np.ndarray] = {}
    for i in range(0, len(model.f0_predictor.condnet), 2):
        conv = model.f0_predictor.condnet[i]
        out[f"hift.f0.condnet.{i}.weight"] = conv.weight.detach().to(torch.float64).numpy().copy()
        out[f"hift.f0.condnet.{i}.bias"] = conv.bias.detach().to(torch.float64).numpy().copy()
    cls = model.f0_predictor.classifier
    out["hift.f0.classifier.weight"] = cls.weight.detach().to(torch.float64).numpy().copy()
    out["hift.f0.classifier.bias"] = cls.bias.detach().to(torch.float64).numpy().copy()
    lin = model.m_source.l_linear
    out["hift.source.l_linear.weight"] = lin.weight.detach().to(torch.float32).numpy().copy()
    out["hift.source.l_linear.bias"] = lin.bias.detach().to(torch.float32).numpy().copy()
    return out

"""Float32 constants that the exported graphs bake in, computed the same way on every CPU.

The official code computes the DiT time-embedding frequencies (`torch.exp`) and the rotary inverse
frequencies (`**`) in float32 torch, whose vectorised kernels differ in the last bit between CPUs
(AVX2 and AVX-512 builds of torch's exp disagree on 3 of the 128 DiT frequencies). Here each value is
the float32 argument the official code forms (IEEE-exact float32 products and quotients), then
exp/pow in float64 by Python's libm, rounded once to float32, with a check that no value lies near a
float32 rounding boundary: any libm within a few float64 ulps gives the same float32, so the graphs
are bit-for-bit the same on every CPU (and as close to the exact value as float32 allows).
"""

from __future__ import annotations

import math

import numpy as np
import torch

# A float64 result within this relative distance of the exact value rounds to the same float32 as
# long as it is farther than that from a float32 rounding boundary (checked per value).
_MARGIN = 2.0**-40


def exact_float32(values: list[float], what: str) -> torch.Tensor:
    """Round float64 values to a float32 tensor, refusing any that a few-ulp libm error could
    round the other way."""
    v = np.asarray(values, dtype=np.float64)
    lo, hi = (v * (1 - _MARGIN)).astype(np.float32), (v * (1 + _MARGIN)).astype(np.float32)
    if not np.array_equal(lo, hi):
        raise ValueError(f"{what}: value {v[lo != hi][0]!r} is too close to a float32 rounding boundary")
    return torch.from_numpy(v.astype(np.float32))


def time_frequencies(half: int) -> torch.Tensor:
    """`exp(arange(half) * -(ln 10000 / (half - 1)))` of the DiT sinusoidal time embedding, float32 [half]."""
    step = np.float32(-(math.log(10000) / (half - 1)))
    args = np.arange(half, dtype=np.float32) * step  # float32, as torch multiplies by the Python float
    return exact_float32([math.exp(float(a)) for a in args], "time-embedding frequencies")


def rope_inverse_frequencies(dim: int, theta: float) -> torch.Tensor:
    """`1 / theta ** (arange(0, dim, 2) / dim)` of rotary embeddings (Qwen2, x-transformers), float32 [dim / 2]."""
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    powers = exact_float32([float(theta) ** float(e) for e in exponents], f"rotary frequencies ({dim}, {theta})")
    return torch.from_numpy(np.float32(1.0) / powers.numpy())

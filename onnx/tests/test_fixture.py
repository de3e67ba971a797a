"""The committed test fixture (tests/fixtures/tiny + prompt) regenerates bit for bit."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import vectorised_normal_kernel

from cosy_export.__main__ import main
from cosy_export.manifest import sha256_file

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "tiny"


def test_fixture_regenerates_bit_for_bit(tmp_path: Path) -> None:
    """Every file of tests/fixtures/tiny and prompt_24k.wav is compared by sha256. That holds on any
    x86-64 CPU with AVX2 (Intel or AMD, with or without AVX-512 or AMX) because no step depends on
    the CPU's float rounding:
    * weights and the flow noise are torch.Generator draws: MT19937 integers, uniforms that are
      multiples of 2^-24, and torch's 8-wide Box-Muller, which torch runs on AVX2 and AVX-512 CPUs
      alike (its scalar kernel, on a CPU without AVX2, draws other values, as the official code
      would there: the test skips), scaled by IEEE-exact float32 products;
    * the constants the graphs bake in (DiT time-embedding and rotary frequencies) are computed in
      float64 and rounded once to float32, checked to be far from any rounding boundary
      (cosy_export/constants.py), not by torch's vectorised float32 exp/pow, which differ by an ulp
      between its AVX2 and AVX-512 kernels;
    * the fp16 variants keep fp32 by rule (node names and op types: flow.MIXED_FP32_*,
      hift.FP16_FP32_SCOPES), and float32 -> float16 is IEEE round-to-nearest-even everywhere;
    * weight-norm folding is float64 rounded once (float32 weights; the float64 f0 predictor
      matched across torch's default, AVX2 and AVX-512 kernels); the prompt is float64 maths
      quantised to 16-bit PCM; the manifest holds hashes and no timestamps.
    """
    if not vectorised_normal_kernel():
        pytest.skip("torch has no AVX2 kernels on this CPU: its scalar normal_ draws other weights")
    out = tmp_path / "tiny"
    assert main(["fixture", str(out)]) == 0
    committed = sorted(p.name for p in FIXTURE.iterdir())
    assert sorted(p.name for p in out.iterdir()) == committed
    for name in committed:
        assert sha256_file(out / name) == sha256_file(FIXTURE / name), f"{name} differs from the committed fixture"  # exact: the fixture is regenerated bit for bit on AVX2 torch (skip above)
    assert sha256_file(tmp_path / "prompt_24k.wav") == sha256_file(FIXTURE.parent / "prompt_24k.wav")  # exact: numpy float64 maths with a seeded generator, quantised to 16-bit PCM (same on every x86-64)


def test_fixture_is_small() -> None:
    total = sum(p.stat().st_size for p in FIXTURE.iterdir())
    assert total < 12_000_000, f"fixture grew to {total / 1e6:.1f} MB"

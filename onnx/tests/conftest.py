"""Shared pytest fixtures: paths to the reference set kept beside the checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ONNX_DIR = Path(__file__).resolve().parents[1]
REPO = ONNX_DIR.parent
sys.path.insert(0, str(ONNX_DIR))

SHARED = Path(os.environ.get("COSY_SHARED", REPO.parent / "shared"))
REFERENCE = SHARED / "reference"


def in_ci() -> bool:
    """True under CI (`CI=true`), where missing test data fails the run instead of skipping."""
    return os.environ.get("CI", "") not in ("", "0", "false")


def skip_or_fail(why: str) -> None:
    """Skip (printing why) outside CI; under CI a test that cannot run is a failure."""
    if in_ci():
        pytest.fail(f"CI=true and {why}: CI must run every test", pytrace=False)
    pytest.skip(why)


def cosy_bin() -> Path:
    """The built cosy binary (debug first, as scripts/test.sh builds it); skip or fail without one."""
    for p in (REPO / "target/debug/cosy", REPO / "target/release/cosy"):
        if p.is_file():
            return p
    skip_or_fail("no built cosy binary (run cargo build first; scripts/test.sh does)")
    raise AssertionError


def vectorised_normal_kernel() -> bool:
    """True where torch's CPU normal_ runs its vectorised Box-Muller (its AVX2 and AVX-512 builds share
    it: every x86-64 CPU with AVX2), which drew the official flow noise and the committed fixture.
    Without AVX2 (capability DEFAULT) torch runs a scalar kernel whose draws differ by up to ~3e-6."""
    import torch

    return torch.backends.cpu.get_cpu_capability() != "DEFAULT"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not (REFERENCE / "tiny-official").is_dir():
        skip_or_fail(f"reference set not found at {REFERENCE} (set COSY_SHARED)")
    return REFERENCE


@pytest.fixture(scope="session")
def tiny_official(reference_dir: Path) -> Path:
    return reference_dir / "tiny-official"


@pytest.fixture(scope="session")
def golden(reference_dir: Path) -> Path:
    return reference_dir / "golden"

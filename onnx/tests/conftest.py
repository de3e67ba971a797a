"""Shared pytest fixtures: paths to the reference set kept beside the checkout."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
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


def dit_no_cache_feeds(sess: Any, batch: int) -> dict[str, np.ndarray]:
    """The prompt-prefix cache inputs of a `dit` call without cached frames, sized from the
    session's declared input shapes (the fixed depth, width and conv context)."""
    shapes = {i.name: i.shape for i in sess.get_inputs()}
    depth, inner = shapes["cache_k"][0], shapes["cache_k"][3]
    ctx, dim = shapes["cache_conv1"][1], shapes["cache_conv1"][2]
    empty = np.zeros((depth, batch, 0, inner), np.float32)
    zeros = np.zeros((batch, ctx, dim), np.float32)
    return {"cache_k": empty, "cache_v": empty, "cache_conv1": zeros, "cache_conv2": zeros,
            "record_frames": np.array([0], np.int64)}

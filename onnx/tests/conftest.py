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


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not (REFERENCE / "tiny-official").is_dir():
        pytest.skip(f"reference set not found at {REFERENCE} (set COSY_SHARED)")
    return REFERENCE


@pytest.fixture(scope="session")
def tiny_official(reference_dir: Path) -> Path:
    return reference_dir / "tiny-official"


@pytest.fixture(scope="session")
def golden(reference_dir: Path) -> Path:
    return reference_dir / "golden"

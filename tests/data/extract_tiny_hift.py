"""Extracts the small HiFT tensors the Rust synthesis tests need from the tiny reference model.

Source: ../shared/reference/tiny-official/hift.pt (the tiny CosyVoice3 model whose golden
intermediates live in ../shared/reference/golden). Writes, into tests/data/tiny_hift/:

* l_linear.weight.npy [1, 9] f32, l_linear.bias.npy [1] f32 (m_source.l_linear, as stored);
* f0.condnet.{0,2,4,6,8}.weight.npy f64 with weight norm folded the way torch does it in float64
  (v * (g / ||v||), norm over every dim except 0), f0.condnet.*.bias.npy f64;
* f0.classifier.weight.npy [1, C] f64, f0.classifier.bias.npy [1] f64.

These mirror the side.safetensors keys `hift.source.*` and `hift.f0.*` of docs/model-format.md.
Run: $COSY_VENV/bin/python tests/data/extract_tiny_hift.py (COSY_SHARED defaults to ../shared)
"""
import os
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
SRC = Path(os.environ.get("COSY_SHARED", REPO.parent / "shared")) / "reference/tiny-official/hift.pt"
OUT = Path(__file__).resolve().parent / "tiny_hift"


def fold_weight_norm(g: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Effective weight of a weight-normed conv, computed in float64."""
    g, v = g.double(), v.double()
    norm = v.norm(2, dim=tuple(range(1, v.dim())), keepdim=True)
    return v * (g / norm)


def main() -> None:
    sd = torch.load(SRC, weights_only=True, map_location="cpu")
    OUT.mkdir(parents=True, exist_ok=True)
    np.save(OUT / "l_linear.weight.npy", sd["m_source.l_linear.weight"].float().numpy())
    np.save(OUT / "l_linear.bias.npy", sd["m_source.l_linear.bias"].float().numpy())
    for i in (0, 2, 4, 6, 8):
        p = f"f0_predictor.condnet.{i}"
        w = fold_weight_norm(sd[f"{p}.parametrizations.weight.original0"],
                             sd[f"{p}.parametrizations.weight.original1"])
        np.save(OUT / f"f0.condnet.{i}.weight.npy", w.numpy())
        np.save(OUT / f"f0.condnet.{i}.bias.npy", sd[f"{p}.bias"].double().numpy())
    np.save(OUT / "f0.classifier.weight.npy", sd["f0_predictor.classifier.weight"].double().numpy())
    np.save(OUT / "f0.classifier.bias.npy", sd["f0_predictor.classifier.bias"].double().numpy())


if __name__ == "__main__":
    main()

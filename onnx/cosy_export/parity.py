"""Compare a cosy `--dump` with a reference-pipeline dump of the same request.

`python -m cosy_export.parity RUNTIME_DUMP REFERENCE_DUMP [--flow-mel-tol 1e-4] [--logmel-tol 2e-3]`

Token arrays must be identical; `flow_mel` must agree within `--flow-mel-tol` max-abs; the
waveform must have the same length and a mean |Δ log-mel| within `--logmel-tol` (the HiFT noise is
given, so the audio is near-exact). Prints one line per array and exits non-zero on a failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

# Integer arrays, compared exactly: tokenizer ids and the streaming schedule are integer-only; the speech
# tokens are argmax/FSQ decisions whose margins on the test cases (>= 4.4e-3 in log-prob, >= 1.3e-3 from an
# FSQ rounding boundary) are far above the float differences between the two sides or between CPUs.
EXACT = ["text_token", "prompt_text_token", "prompt_speech_token", "llm_token_raw", "speech_token", "chunk_samples"]


def log_mel(wav: np.ndarray, sr: int = 24000, n_fft: int = 1024, hop: int = 256, n_mels: int = 80) -> np.ndarray:
    """Natural-log HTK mel spectrogram in numpy (the measure the reference set's compare.py uses)."""
    wav = np.asarray(wav, dtype=np.float64).reshape(-1)
    pad = n_fft // 2
    x = np.pad(wav, (pad, pad), mode="reflect")
    frames = 1 + (len(x) - n_fft) // hop
    idx = np.arange(n_fft)[None, :] + hop * np.arange(frames)[:, None]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    spec = np.abs(np.fft.rfft(x[idx] * window, axis=1)) ** 2
    mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    inv = lambda m: 700.0 * (10 ** (m / 2595.0) - 1.0)  # noqa: E731
    edges = inv(np.linspace(mel(0.0), mel(sr / 2), n_mels + 2))
    freqs = np.linspace(0, sr / 2, n_fft // 2 + 1)
    fb = np.zeros((n_mels, len(freqs)))
    for m in range(n_mels):
        lo, c, hi = edges[m], edges[m + 1], edges[m + 2]
        fb[m] = np.clip(np.minimum((freqs - lo) / (c - lo), (hi - freqs) / (hi - c)), 0, None)
    return np.log(np.maximum(spec @ fb.T, 1e-10))


def compare(runtime: Path, reference: Path, flow_mel_tol: float, logmel_tol: float) -> list[str]:
    failures: list[str] = []
    for name in EXACT:
        a, b = runtime / f"{name}.npy", reference / f"{name}.npy"
        if not b.exists():
            continue
        x, y = np.load(a).reshape(-1), np.load(b).reshape(-1)
        ok = x.shape == y.shape and bool((x.astype(np.int64) == y.astype(np.int64)).all())
        print(f"{name:22s} {'ok' if ok else 'DIFFERS'} ({x.size} vs {y.size} values)")
        if not ok:
            failures.append(name)
    x, y = np.load(runtime / "flow_mel.npy").squeeze(), np.load(reference / "flow_mel.npy").squeeze()
    err = float(np.abs(x - y).max()) if x.shape == y.shape else float("inf")
    print(f"{'flow_mel':22s} max-abs {err:.3e} (tol {flow_mel_tol:g})")
    if not err <= flow_mel_tol:
        failures.append("flow_mel")
    x, y = np.load(runtime / "waveform.npy").reshape(-1), np.load(reference / "waveform.npy").reshape(-1)
    if x.shape != y.shape:
        print(f"{'waveform':22s} length {x.size} vs {y.size}")
        failures.append("waveform")
    else:
        d = float(np.abs(log_mel(x) - log_mel(y)).mean())
        print(f"{'waveform':22s} mean |d log-mel| {d:.3e} (tol {logmel_tol:g}), max-abs {np.abs(x - y).max():.3e}")
        if not d <= logmel_tol:
            failures.append("waveform")
    return failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runtime", type=Path)
    p.add_argument("reference", type=Path)
    p.add_argument("--flow-mel-tol", type=float, default=1e-4)
    p.add_argument("--logmel-tol", type=float, default=2e-3)
    args = p.parse_args(argv)
    failures = compare(args.runtime, args.reference, args.flow_mel_tol, args.logmel_tol)
    print("PASS" if not failures else f"FAIL: {', '.join(failures)}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""One row of bench/first_hop.sh: a streamed file against the same tokens said offline.

    hop_fidelity.py OFFLINE.wav STREAMED.wav PROFILE.json OFFLINE_TOKENS.npy STREAMED_TOKENS.npy HOP

SNR = 10 log10(sum offline^2 / sum (streamed - offline)^2); the log-spectrum distance is the mean
absolute difference of the two 20 log10 |STFT| (1024-point Hann, hop 256, floored at -100 dB).
The tokens must be the same (the same seed): the schedule changes the flow's chunks, not the LLM.
"""

from __future__ import annotations

import json
import sys

import numpy as np


def wav_f32(path: str) -> np.ndarray:
    b = open(path, "rb").read()
    i = 12
    while i + 8 <= len(b):
        tag, n = b[i : i + 4], int.from_bytes(b[i + 4 : i + 8], "little")
        if tag == b"data":
            return np.frombuffer(b[i + 8 : i + 8 + n], dtype="<f4").astype(np.float64)
        i += 8 + n + (n & 1)
    raise SystemExit(f"{path}: no data chunk")


def log_spec(x: np.ndarray) -> np.ndarray:
    win = np.hanning(1024)
    frames = [x[s : s + 1024] * win for s in range(0, max(len(x) - 1024, 0) + 1, 256)]
    mag = np.abs(np.fft.rfft(np.array(frames), axis=1))
    return np.maximum(20 * np.log10(np.maximum(mag, 1e-12)), -100.0)


def main() -> None:
    off_path, st_path, prof_path, off_tok, st_tok, hop = sys.argv[1:7]
    a, b = np.load(off_tok).reshape(-1), np.load(st_tok).reshape(-1)
    if a.shape != b.shape or not np.array_equal(a, b):
        raise SystemExit(f"hop {hop}: the streamed tokens differ from the offline ones; the comparison would be meaningless")
    x, y = wav_f32(off_path), wav_f32(st_path)
    n = min(len(x), len(y))
    x, y = x[:n], y[:n]
    snr = 10 * np.log10(np.sum(x**2) / max(np.sum((y - x) ** 2), 1e-30))
    dist = float(np.mean(np.abs(log_spec(x) - log_spec(y))))
    prof = json.load(open(prof_path))
    ttfb = prof.get("ttfb_ms")
    hops = [int(hop)]
    while sum(hops) < len(a) and len(hops) < 6:
        hops.append(min(100, hops[-1] * 2) if hops[-1] < 100 else hops[-1])
    print(f"| {hop} | {', '.join(map(str, hops))}… | {ttfb:.0f} | {snr:.1f} | {dist:.2f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks float32 wav files (`cosy file --format wavf32`) for NaN/Inf samples: prints length, peak,
RMS and the count of non-finite samples of each; exits 1 if any sample is not finite (numpy only)."""
import sys

import numpy as np


def samples(path: str) -> tuple[np.ndarray, int]:
    b = open(path, "rb").read()
    rate, i = 0, 12
    while i + 8 <= len(b):
        tag, n = b[i:i + 4], int.from_bytes(b[i + 4:i + 8], "little")
        if tag == b"fmt ":
            rate = int.from_bytes(b[i + 12:i + 16], "little")
        if tag == b"data":
            return np.frombuffer(b[i + 8:i + 8 + n], dtype="<f4"), rate
        i += 8 + n + (n & 1)
    raise SystemExit(f"{path}: no data chunk")


bad_files = 0
for path in sys.argv[1:]:
    x, rate = samples(path)
    bad = int((~np.isfinite(x)).sum())
    fin = x[np.isfinite(x)].astype(np.float64)
    peak = float(np.abs(fin).max()) if fin.size else float("nan")
    rms = float(np.sqrt((fin ** 2).mean())) if fin.size else float("nan")
    print(f"{path}: {x.size / max(rate, 1):.2f} s at {rate} Hz, peak {peak:.3f}, rms {rms:.4f}, non-finite samples {bad}")
    bad_files += bad > 0
sys.exit(1 if bad_files else 0)

"""A deterministic, speech-like prompt signal for demos and tests (no real voice is available).

Harmonic source with a drifting pitch and vibrato, a syllable envelope with two gliding formant
resonances, fricative-like noise bursts in the pauses and a low noise floor. It is not speech; it
only exercises the prompt path with realistic spectra and dynamics.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .wavio import write_wav_pcm16


def synth_prompt(seconds: float = 3.0, sample_rate: int = 24000, seed: int = 7, f0: float = 130.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(seconds * sample_rate)
    t = np.arange(n) / sample_rate
    pitch = f0 * (1.0 - 0.12 * t / seconds) * (1.0 + 0.02 * np.sin(2 * np.pi * 5.5 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / sample_rate
    syllables = 6
    syl = (t * syllables / seconds) % 1.0
    voiced = (syl > 0.12) & (syl < 0.85)
    env = np.where(voiced, np.sin(np.pi * np.clip((syl - 0.12) / 0.73, 0, 1)) ** 0.6, 0.0)
    idx = np.floor(t * syllables / seconds).astype(int)
    f1 = 500 + 250 * np.sin(1.7 * idx + 3 * syl)
    f2 = 1500 + 600 * np.cos(1.3 * idx + 2 * syl)
    signal = np.zeros(n)
    for h in range(1, 40):
        fh = h * pitch
        gain = np.exp(-(((fh - f1) / 180.0) ** 2)) + 0.6 * np.exp(-(((fh - f2) / 250.0) ** 2)) + 0.05 / h
        signal += gain * np.sin(h * phase) * (fh < sample_rate / 2 - 500)
    signal *= env
    fric = rng.standard_normal(n) * (~voiced) * (syl > 0.88) * 0.15
    signal = signal / (np.abs(signal).max() + 1e-9) * 0.5 + fric + 0.004 * rng.standard_normal(n)
    return np.clip(signal, -0.99, 0.99).astype(np.float32)


def write_prompt(path: Path | str, seconds: float = 3.0, sample_rate: int = 24000, seed: int = 7) -> None:
    write_wav_pcm16(path, synth_prompt(seconds, sample_rate, seed), sample_rate)

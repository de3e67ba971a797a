"""Writes the compressed-format prompt fixtures in tests/fixtures/formats/.

One 1.2 s stereo, 24 kHz, 16-bit, speech-like signal (a gliding harmonic tone under a syllable
envelope, the right channel a quieter copy) saved as wav, flac, ogg/vorbis and mp3, so the Rust
tests can check that each decodes to the same audio (exactly for flac, closely for the lossy ones).

Needs `soundfile` (libsndfile 1.2 or newer for mp3), which the exporter does not:
    python -m venv /tmp/sf && /tmp/sf/bin/pip install soundfile numpy
    /tmp/sf/bin/python tests/data/make_audio_formats.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf

RATE = 24_000
SECONDS = 1.2
OUT = Path(__file__).resolve().parent.parent / "fixtures" / "formats"


def speechlike() -> np.ndarray:
    """[frames, 2] int16."""
    t = np.arange(int(RATE * SECONDS)) / RATE
    f0 = 140.0 + 40.0 * np.sin(2 * np.pi * 1.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    voice = sum(np.sin(h * phase) / h for h in range(1, 9))
    envelope = np.clip(np.sin(2 * np.pi * 2.5 * t), 0.0, None) ** 0.5
    left = 0.25 * voice * envelope
    stereo = np.stack([left, 0.5 * left], axis=1)
    return np.round(stereo * 32767).astype(np.int16)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    pcm = speechlike()
    sf.write(OUT / "speechlike.wav", pcm, RATE, subtype="PCM_16")
    sf.write(OUT / "speechlike.flac", pcm, RATE, subtype="PCM_16")
    # The lossy encoders get float input: libsndfile 1.2.2 mangles int16 input to mp3 (the decoded
    # audio correlates only ~0.5 with the original).
    as_float = pcm.astype(np.float32) / 32768.0
    sf.write(OUT / "speechlike.ogg", as_float, RATE, format="OGG", subtype="VORBIS")
    sf.write(OUT / "speechlike.mp3", as_float, RATE, format="MP3", subtype="MPEG_LAYER_III")
    for p in sorted(OUT.iterdir()):
        print(f"{p.name}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()

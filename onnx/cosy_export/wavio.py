"""Minimal RIFF/WAVE reader (numpy only).

Reads what the official frontend reads through ``torchaudio.load(backend='soundfile')`` and returns
the same float32 samples soundfile would give:

* PCM integer (format tag 1): 8-bit unsigned, 16/24/32-bit signed, scaled to [-1, 1) by 2^(bits-1)
  (8-bit: (x - 128) / 128);
* IEEE float (format tag 3): 32- or 64-bit, returned as is (64-bit is cast to float32);
* WAVE_FORMAT_EXTENSIBLE (0xFFFE) with a PCM or float sub-format GUID.

Other chunks (``fact``, ``LIST``, ...) are skipped; odd-sized chunks are padded to even length as RIFF
requires.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_IEEE_FLOAT = 0x0003
WAVE_FORMAT_EXTENSIBLE = 0xFFFE


class WavError(ValueError):
    """The file is not a WAV file this reader supports."""


@dataclass(frozen=True)
class WavData:
    """Decoded WAV contents: ``samples`` is float32 [frames, channels]."""

    sample_rate: int
    samples: np.ndarray

    @property
    def channels(self) -> int:
        return int(self.samples.shape[1])

    def mono(self) -> np.ndarray:
        """Average the channels (as the official ``load_wav`` does), float32 [frames]."""
        if self.channels == 1:
            return self.samples[:, 0].copy()
        # torch's mean over float32 accumulates in float32 pairwise; float64 then cast is at least as exact.
        return self.samples.astype(np.float64).mean(axis=1).astype(np.float32)


def parse_wav(data: bytes) -> WavData:
    """Decode a RIFF/WAVE byte string."""
    if len(data) < 12 or data[0:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise WavError("not a RIFF/WAVE file")
    pos = 12
    fmt: tuple[int, int, int, int, int] | None = None  # tag, channels, rate, block_align, bits
    payload: bytes | None = None
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack_from("<I", data, pos + 4)
        body = data[pos + 8 : pos + 8 + size]
        if chunk_id == b"fmt ":
            if len(body) < 16:
                raise WavError("fmt chunk too short")
            tag, channels, rate, _byte_rate, block_align, bits = struct.unpack_from("<HHIIHH", body, 0)
            if tag == WAVE_FORMAT_EXTENSIBLE:
                if len(body) < 40:
                    raise WavError("extensible fmt chunk too short")
                # The first two bytes of the sub-format GUID hold the real format tag.
                (tag,) = struct.unpack_from("<H", body, 24)
            fmt = (tag, channels, rate, block_align, bits)
        elif chunk_id == b"data":
            payload = body
        pos += 8 + size + (size & 1)
    if fmt is None:
        raise WavError("missing fmt chunk")
    if payload is None:
        raise WavError("missing data chunk")
    tag, channels, rate, block_align, bits = fmt
    if channels < 1 or rate < 1:
        raise WavError(f"bad fmt: channels={channels} rate={rate}")
    bytes_per_sample = bits // 8
    if bits % 8 != 0 or block_align != bytes_per_sample * channels:
        raise WavError(f"unsupported sample layout: bits={bits} block_align={block_align}")
    frames = len(payload) // block_align
    raw = payload[: frames * block_align]

    if tag == WAVE_FORMAT_PCM:
        if bits == 8:
            samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
        elif bits == 16:
            samples = np.frombuffer(raw, dtype="<i2").astype(np.float32) / np.float32(32768.0)
        elif bits == 24:
            b = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
            ints = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
            ints = np.where(ints >= 1 << 23, ints - (1 << 24), ints)
            samples = (ints.astype(np.float64) / float(1 << 23)).astype(np.float32)
        elif bits == 32:
            ints = np.frombuffer(raw, dtype="<i4")
            samples = (ints.astype(np.float64) / float(1 << 31)).astype(np.float32)
        else:
            raise WavError(f"unsupported PCM bit depth {bits}")
    elif tag == WAVE_FORMAT_IEEE_FLOAT:
        if bits == 32:
            samples = np.frombuffer(raw, dtype="<f4").astype(np.float32)
        elif bits == 64:
            samples = np.frombuffer(raw, dtype="<f8").astype(np.float32)
        else:
            raise WavError(f"unsupported float bit depth {bits}")
    else:
        raise WavError(f"unsupported WAV format tag 0x{tag:04x}")
    return WavData(sample_rate=int(rate), samples=samples.reshape(frames, channels))


def read_wav(path: str | Path) -> WavData:
    """Read a WAV file from disk."""
    return parse_wav(Path(path).read_bytes())


def write_wav_pcm16(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    """Write mono float samples in [-1, 1] as 16-bit PCM (round to nearest, clipped)."""
    ints = np.clip(np.round(np.asarray(samples, dtype=np.float64) * 32768.0), -32768, 32767).astype("<i2")
    body = ints.tobytes()
    header = b"RIFF" + struct.pack("<I", 36 + len(body)) + b"WAVE"
    header += b"fmt " + struct.pack("<IHHIIHH", 16, WAVE_FORMAT_PCM, 1, sample_rate, sample_rate * 2, 2, 16)
    header += b"data" + struct.pack("<I", len(body))
    Path(path).write_bytes(header + body)

"""Prompt-audio front-end features of CosyVoice3, in numpy (cosyvoice3.md §2.5, §3.4).

These functions are the reference the Rust front-end is checked against. They reproduce, without
torchaudio / whisper / librosa / matcha:

* ``load_wav``         -- ``cosyvoice.utils.file_utils.load_wav``: mono average + torchaudio's default
                          ``Resample`` (sinc_interp_hann, lowpass_filter_width 6, rolloff 0.99);
* ``whisper_log_mel``  -- ``whisper.log_mel_spectrogram(x, n_mels=128)`` (speech-tokenizer input);
* ``kaldi_fbank``      -- ``torchaudio.compliance.kaldi.fbank(x, num_mel_bins=80, dither=0,
                          sample_frequency=16000)``; ``campplus_features`` adds the time-mean removal;
* ``matcha_mel``       -- Matcha ``mel_spectrogram`` with the CosyVoice3 settings (24 kHz flow prompt mel);
* ``align_prompt``     -- the token/mel trimming of ``frontend_zero_shot``.

Numerics: the arithmetic runs in float64 and the results are cast to float32 once. The official code
runs in float32, so the two differ by the float32 rounding of the official path (reference/README §6);
the float64 path is the better-defined target for other implementations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .wavio import read_wav

# Rates used by the CosyVoice3 front-end.
TOKENIZER_SAMPLE_RATE = 16000
FLOW_SAMPLE_RATE = 24000
MAX_TOKENIZER_SECONDS = 30

FLOAT32_EPS = float(np.finfo(np.float32).eps)  # torchaudio.compliance.kaldi's log floor


# ----------------------------------------------------------------------------------------------------
# Resampling (torchaudio.functional.resample / transforms.Resample defaults)
# ----------------------------------------------------------------------------------------------------


def sinc_resample_kernel(
    orig_freq: int, new_freq: int, lowpass_filter_width: int = 6, rolloff: float = 0.99
) -> tuple[np.ndarray, int]:
    """Polyphase sinc-Hann kernel [new, 2*width + orig] (float32) and ``width``, after gcd reduction.

    Output sample j of each block of ``new`` samples is the dot product of row j with the input
    window starting at ``block*orig - width``. Built in float64 and rounded to float32 once, as
    torchaudio does when no dtype is given; torchaudio forms the phase offsets -j/new as float32 first
    (integer arange divided in the default dtype), which is reproduced here.
    """
    g = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // g, new_freq // g
    base_freq = min(orig, new) * rolloff
    width = math.ceil(lowpass_filter_width * orig / base_freq)
    idx = np.arange(-width, width + orig, dtype=np.float64) / orig
    phase = (np.arange(0, -new, -1, dtype=np.float32) / np.float32(new)).astype(np.float64)
    t = (phase[:, None] + idx[None, :]) * base_freq
    t = np.clip(t, -lowpass_filter_width, lowpass_filter_width)
    window = np.cos(t * math.pi / lowpass_filter_width / 2) ** 2
    t = t * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        sinc = np.where(t == 0, 1.0, np.sin(t) / np.where(t == 0, 1.0, t))
    kernel = sinc * (window * (base_freq / orig))
    return kernel.astype(np.float32), width


def resample(wav: np.ndarray, orig_freq: int, new_freq: int) -> np.ndarray:
    """Resample a 1-D float signal like ``torchaudio.transforms.Resample(orig_freq, new_freq)``."""
    wav = np.asarray(wav, dtype=np.float32)
    if orig_freq == new_freq:
        return wav.copy()
    g = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // g, new_freq // g
    kernel, width = sinc_resample_kernel(orig_freq, new_freq)
    length = wav.shape[0]
    padded = np.concatenate(
        [np.zeros(width, np.float64), wav.astype(np.float64), np.zeros(width + orig, np.float64)]
    )
    taps = kernel.shape[1]
    windows = np.lib.stride_tricks.sliding_window_view(padded, taps)[::orig]  # [blocks, taps]
    out = (windows @ kernel.astype(np.float64).T).reshape(-1)  # block-major, phase-minor
    target = math.ceil(new * length / orig)
    return out[:target].astype(np.float32)


def load_wav(path: str | Path, target_sr: int, min_sr: int = 16000) -> np.ndarray:
    """Read a WAV file as mono float32 at ``target_sr`` (the official ``load_wav``)."""
    data = read_wav(path)
    if data.sample_rate < min_sr:
        raise ValueError(f"wav sample rate {data.sample_rate} must be at least {min_sr}")
    return resample(data.mono(), data.sample_rate, target_sr)


# ----------------------------------------------------------------------------------------------------
# Shared STFT helpers
# ----------------------------------------------------------------------------------------------------


def hann_window(size: int, periodic: bool = True) -> np.ndarray:
    """``torch.hann_window`` in float64."""
    denom = size if periodic else size - 1
    n = np.arange(size, dtype=np.float64)
    return 0.5 - 0.5 * np.cos(2.0 * math.pi * n / denom)


def _frames(signal: np.ndarray, frame_length: int, hop: int) -> np.ndarray:
    """Frames [n, frame_length] with no padding: n = 1 + (len - frame_length) // hop."""
    return np.lib.stride_tricks.sliding_window_view(signal, frame_length)[::hop]


def _rfft_frames(frames: np.ndarray, window: np.ndarray, n_fft: int) -> np.ndarray:
    """Complex one-sided spectrum [n, n_fft//2 + 1] of windowed frames (zero-padded to n_fft)."""
    return np.fft.rfft(frames * window[None, :], n=n_fft, axis=1)


# ----------------------------------------------------------------------------------------------------
# Slaney mel filterbank (librosa.filters.mel, htk=False, norm="slaney")
# ----------------------------------------------------------------------------------------------------

_SLANEY_F_SP = 200.0 / 3
_SLANEY_MIN_LOG_HZ = 1000.0
_SLANEY_MIN_LOG_MEL = _SLANEY_MIN_LOG_HZ / _SLANEY_F_SP
_SLANEY_LOGSTEP = math.log(6.4) / 27.0


def _hz_to_slaney_mel(hz: float) -> float:
    if hz >= _SLANEY_MIN_LOG_HZ:
        return _SLANEY_MIN_LOG_MEL + math.log(hz / _SLANEY_MIN_LOG_HZ) / _SLANEY_LOGSTEP
    return hz / _SLANEY_F_SP


def _slaney_mel_to_hz(mels: np.ndarray) -> np.ndarray:
    linear = _SLANEY_F_SP * mels
    log_part = _SLANEY_MIN_LOG_HZ * np.exp(_SLANEY_LOGSTEP * (mels - _SLANEY_MIN_LOG_MEL))
    return np.where(mels >= _SLANEY_MIN_LOG_MEL, log_part, linear)


def slaney_mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """Mel filterbank [n_mels, n_fft//2 + 1] float32, equal to ``librosa.filters.mel`` (slaney/slaney).

    librosa writes each triangle into a float32 matrix and then scales it in place by the float64 area
    normalisation, so the values are rounded to float32 twice; that is reproduced.
    """
    if fmax is None:
        fmax = sample_rate / 2.0
    fft_freqs = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    mel_points = np.linspace(_hz_to_slaney_mel(fmin), _hz_to_slaney_mel(fmax), n_mels + 2)
    hz_points = _slaney_mel_to_hz(mel_points)
    fdiff = np.diff(hz_points)
    ramps = hz_points[:, None] - fft_freqs[None, :]
    weights = np.zeros((n_mels, fft_freqs.shape[0]), dtype=np.float32)
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0.0, np.minimum(lower, upper))
    enorm = 2.0 / (hz_points[2 : n_mels + 2] - hz_points[:n_mels])
    return (weights.astype(np.float64) * enorm[:, None]).astype(np.float32)


# ----------------------------------------------------------------------------------------------------
# Whisper log-mel (speech tokenizer input)
# ----------------------------------------------------------------------------------------------------

WHISPER_N_FFT = 400
WHISPER_HOP = 160


def whisper_log_mel(wav16k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """``whisper.log_mel_spectrogram(wav16k, n_mels)``: float32 [n_mels, len // 160]."""
    x = np.asarray(wav16k, dtype=np.float64)
    if x.shape[0] <= WHISPER_N_FFT // 2:
        raise ValueError("audio too short for whisper's reflect padding")
    padded = np.pad(x, (WHISPER_N_FFT // 2, WHISPER_N_FFT // 2), mode="reflect")
    spec = _rfft_frames(_frames(padded, WHISPER_N_FFT, WHISPER_HOP), hann_window(WHISPER_N_FFT), WHISPER_N_FFT)
    power = (spec.real**2 + spec.imag**2)[:-1]  # whisper drops the last frame
    filters = slaney_mel_filterbank(TOKENIZER_SAMPLE_RATE, WHISPER_N_FFT, n_mels).astype(np.float64)
    mel = filters @ power.T  # [n_mels, T]
    log_spec = np.log10(np.maximum(mel, 1e-10))
    log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).astype(np.float32)


# ----------------------------------------------------------------------------------------------------
# Kaldi fbank (campplus input)
# ----------------------------------------------------------------------------------------------------

KALDI_FRAME_LENGTH = 400  # 25 ms at 16 kHz
KALDI_FRAME_SHIFT = 160  # 10 ms
KALDI_PADDED_LENGTH = 512  # next power of two
KALDI_PREEMPHASIS = 0.97


def _kaldi_mel_scale(freq: np.ndarray | float) -> np.ndarray | float:
    return 1127.0 * np.log(1.0 + np.asarray(freq, dtype=np.float64) / 700.0)


def kaldi_mel_banks(
    num_bins: int, padded_window: int, sample_rate: float, low_freq: float = 20.0, high_freq: float = 0.0
) -> np.ndarray:
    """Kaldi triangular mel banks [num_bins, padded_window//2 + 1] (last column zero), float64.

    Same construction as torchaudio.compliance.kaldi.get_mel_banks without VTLN warping: triangles
    evenly spaced on 1127·ln(1 + f/700) between low_freq and high_freq (<= 0 means Nyquist + value).
    """
    nyquist = 0.5 * sample_rate
    if high_freq <= 0.0:
        high_freq += nyquist
    if not (0.0 <= low_freq < nyquist and 0.0 < high_freq <= nyquist and low_freq < high_freq):
        raise ValueError(f"bad mel range low={low_freq} high={high_freq} nyquist={nyquist}")
    num_fft_bins = padded_window // 2
    fft_bin_width = sample_rate / padded_window
    mel_low = float(_kaldi_mel_scale(low_freq))
    mel_high = float(_kaldi_mel_scale(high_freq))
    delta = (mel_high - mel_low) / (num_bins + 1)
    b = np.arange(num_bins, dtype=np.float64)[:, None]
    left = mel_low + b * delta
    center = mel_low + (b + 1.0) * delta
    right = mel_low + (b + 2.0) * delta
    mel = _kaldi_mel_scale(fft_bin_width * np.arange(num_fft_bins, dtype=np.float64))[None, :]
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = np.maximum(0.0, np.minimum(up, down))
    return np.pad(banks, ((0, 0), (0, 1)))


def povey_window(size: int) -> np.ndarray:
    """Kaldi's povey window: symmetric Hann to the power 0.85."""
    return hann_window(size, periodic=False) ** 0.85


def kaldi_fbank(wav16k: np.ndarray, num_mel_bins: int = 80, sample_rate: int = TOKENIZER_SAMPLE_RATE) -> np.ndarray:
    """Log mel filterbank energies float32 [1 + (N - 400)//160, num_mel_bins] (kaldi defaults, dither 0).

    The waveform is used as given (not scaled to the int16 range), like the official call.
    """
    x = np.asarray(wav16k, dtype=np.float64)
    if sample_rate != TOKENIZER_SAMPLE_RATE:
        raise ValueError("kaldi_fbank is only defined here for 16 kHz input")
    if x.shape[0] < KALDI_FRAME_LENGTH:
        raise ValueError(f"need at least {KALDI_FRAME_LENGTH} samples, got {x.shape[0]}")
    frames = _frames(x, KALDI_FRAME_LENGTH, KALDI_FRAME_SHIFT).copy()
    frames -= frames.mean(axis=1, keepdims=True)  # remove_dc_offset
    previous = np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)  # replicate-pad the first sample
    frames = frames - KALDI_PREEMPHASIS * previous
    spec = _rfft_frames(frames, povey_window(KALDI_FRAME_LENGTH), KALDI_PADDED_LENGTH)
    power = spec.real**2 + spec.imag**2
    banks = kaldi_mel_banks(num_mel_bins, KALDI_PADDED_LENGTH, float(sample_rate))
    mel = power @ banks.T
    return np.log(np.maximum(mel, FLOAT32_EPS)).astype(np.float32)


def campplus_features(wav16k: np.ndarray) -> np.ndarray:
    """campplus input [T, 80]: kaldi fbank minus its mean over time (float32)."""
    fbank = kaldi_fbank(wav16k).astype(np.float64)
    return (fbank - fbank.mean(axis=0, keepdims=True)).astype(np.float32)


# ----------------------------------------------------------------------------------------------------
# Matcha mel (24 kHz flow prompt / HiFT input domain)
# ----------------------------------------------------------------------------------------------------

MEL_N_FFT = 1920
MEL_HOP = 480
MEL_N_MELS = 80


def matcha_mel(wav24k: np.ndarray, sample_rate: int = FLOW_SAMPLE_RATE, n_mels: int = MEL_N_MELS) -> np.ndarray:
    """CosyVoice3 ``feat_extractor``: float32 [n_mels, len // 480] natural-log magnitude mel."""
    x = np.asarray(wav24k, dtype=np.float64)
    pad = (MEL_N_FFT - MEL_HOP) // 2
    if x.shape[0] <= pad:
        raise ValueError(f"need more than {pad} samples for the reflect padding, got {x.shape[0]}")
    padded = np.pad(x, (pad, pad), mode="reflect")
    spec = _rfft_frames(_frames(padded, MEL_N_FFT, MEL_HOP), hann_window(MEL_N_FFT), MEL_N_FFT)
    magnitude = np.sqrt(spec.real**2 + spec.imag**2 + 1e-9)
    basis = slaney_mel_filterbank(sample_rate, MEL_N_FFT, n_mels, 0.0, None).astype(np.float64)
    mel = basis @ magnitude.T
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)


# ----------------------------------------------------------------------------------------------------
# Prompt assembly
# ----------------------------------------------------------------------------------------------------


def align_prompt(speech_tokens: np.ndarray, prompt_feat: np.ndarray, token_mel_ratio: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Trim tokens [N] and mel [T, 80] so that T == 2·N: L = min(T // 2, N) (frontend_zero_shot)."""
    n = min(prompt_feat.shape[0] // token_mel_ratio, speech_tokens.shape[0])
    return speech_tokens[:n], prompt_feat[: token_mel_ratio * n]


@dataclass
class PromptFeatures:
    """Every front-end feature of one prompt wav (shapes without batch dims)."""

    whisper_mel: np.ndarray  # f32 [128, T16]
    campplus_fbank: np.ndarray  # f32 [Tf, 80]
    prompt_feat_raw: np.ndarray  # f32 [T24, 80]


def prompt_features(wav_path: str | Path) -> PromptFeatures:
    """Compute the three prompt features the way the official frontend does (each from the file)."""
    wav16k = load_wav(wav_path, TOKENIZER_SAMPLE_RATE)
    if wav16k.shape[0] / TOKENIZER_SAMPLE_RATE > MAX_TOKENIZER_SECONDS:
        raise ValueError(f"prompt longer than {MAX_TOKENIZER_SECONDS} s is not supported by the speech tokenizer")
    wav24k = load_wav(wav_path, FLOW_SAMPLE_RATE)
    return PromptFeatures(
        whisper_mel=whisper_log_mel(wav16k),
        campplus_fbank=campplus_features(wav16k),
        prompt_feat_raw=matcha_mel(wav24k).T.copy(),
    )

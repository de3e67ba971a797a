"""Front-end features (features.py, wavio.py) against the official golden intermediates."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from cosy_export import features as F
from cosy_export.wavio import WavError, parse_wav, read_wav, write_wav_pcm16

CASES = ["en", "zh", "num", "p16k", "stream"]
# reference/README.md §6 tolerances (max-abs).
TOLERANCE = {"whisper_mel": 2e-4, "campplus_fbank": 2e-3, "prompt_feat_raw": 5e-3, "prompt_feat": 5e-3}


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def features_by_wav(reference_dir: Path) -> dict[str, F.PromptFeatures]:
    """Features of each distinct prompt wav, computed once."""
    out: dict[str, F.PromptFeatures] = {}
    for case in CASES:
        wav = json.loads((reference_dir / "golden" / case / "meta.json").read_text())["prompt_wav"]
        if wav not in out:
            out[wav] = F.prompt_features(reference_dir / wav)
    return out


def _case_features(reference_dir: Path, features_by_wav: dict[str, F.PromptFeatures], case: str) -> F.PromptFeatures:
    wav = json.loads((reference_dir / "golden" / case / "meta.json").read_text())["prompt_wav"]
    return features_by_wav[wav]


@pytest.mark.parametrize("case", CASES)
def test_features_match_golden(reference_dir: Path, golden: Path, features_by_wav, case: str) -> None:
    feats = _case_features(reference_dir, features_by_wav, case)
    for name, ours in [
        ("whisper_mel", feats.whisper_mel),
        ("campplus_fbank", feats.campplus_fbank),
        ("prompt_feat_raw", feats.prompt_feat_raw),
    ]:
        ref = np.load(golden / case / f"{name}.npy")[0]
        assert ours.dtype == np.float32
        assert ours.shape == ref.shape, name
        err = float(np.abs(ours - ref).max())
        assert err <= TOLERANCE[name], f"{case} {name}: max-abs {err:.3g}"


@pytest.mark.parametrize("case", CASES)
def test_onnx_frontend_models_on_our_features(
    reference_dir: Path, tiny_official: Path, golden: Path, features_by_wav, case: str
) -> None:
    feats = _case_features(reference_dir, features_by_wav, case)
    campplus = _session(tiny_official / "campplus.onnx")
    tokenizer = _session(tiny_official / "speech_tokenizer_v3.onnx")

    embedding = campplus.run(None, {campplus.get_inputs()[0].name: feats.campplus_fbank[None]})[0]
    ref_embedding = np.load(golden / case / "speaker_embedding.npy")
    assert embedding.shape == ref_embedding.shape
    assert float(np.abs(embedding - ref_embedding).max()) <= 1e-4

    names = [i.name for i in tokenizer.get_inputs()]
    mel = feats.whisper_mel[None]
    tokens = tokenizer.run(None, {names[0]: mel, names[1]: np.array([mel.shape[2]], np.int32)})[0].reshape(-1)
    # discrete FSQ codes: the pre-rounding values of these prompts stay >= 3.5e-3 from a rounding boundary,
    # far beyond what our mel (<= 2e-4 off) or another CPU's ORT kernels move them
    np.testing.assert_array_equal(tokens, np.load(golden / case / "prompt_speech_token_raw.npy").reshape(-1))

    aligned_tokens, aligned_feat = F.align_prompt(tokens, feats.prompt_feat_raw)  # integer-only cut
    np.testing.assert_array_equal(aligned_tokens, np.load(golden / case / "prompt_speech_token.npy").reshape(-1))
    ref_feat = np.load(golden / case / "prompt_feat.npy")[0]
    assert aligned_feat.shape == ref_feat.shape == (2 * aligned_tokens.shape[0], 80)
    assert float(np.abs(aligned_feat - ref_feat).max()) <= TOLERANCE["prompt_feat"]


def test_align_prompt_takes_the_shorter_side() -> None:
    tokens = np.arange(10)
    feat = np.zeros((17, 80), np.float32)
    t, f = F.align_prompt(tokens, feat)
    assert t.shape == (8,) and f.shape == (16, 80)
    t, f = F.align_prompt(tokens[:5], feat)
    assert t.shape == (5,) and f.shape == (10, 80)


def test_wav_formats(reference_dir: Path) -> None:
    pcm = read_wav(reference_dir / "prompts" / "prompt_24k.wav")
    assert pcm.sample_rate == 24000 and pcm.samples.shape == (74400, 1)
    flt = read_wav(reference_dir / "prompts" / "prompt_16k.wav")
    assert flt.sample_rate == 16000 and flt.samples.shape == (40000, 1)
    # PCM16 decodes to exact multiples of 1/32768 (int16 / 2^15 is exact in float32).
    scaled = pcm.samples * 32768.0
    np.testing.assert_array_equal(scaled, np.round(scaled))


def test_wav_roundtrip_and_stereo_average(tmp_path: Path) -> None:
    sig = (np.sin(np.arange(1000) / 7.0) * 0.5).astype(np.float32)
    path = tmp_path / "a.wav"
    write_wav_pcm16(path, sig, 22050)
    back = read_wav(path)
    assert back.sample_rate == 22050
    assert float(np.abs(back.mono() - sig).max()) <= 1.0 / 32768

    # Build a stereo float32 file by hand, with an odd-sized extra chunk before the data.
    left, right = np.float32([0.5, -1.0, 0.25]), np.float32([0.25, 1.0, -0.75])
    body = np.stack([left, right], axis=1).astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 2, 16000, 16000 * 8, 8, 32)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"junk" + struct.pack("<I", 3) + b"xyz\x00"
    chunks += b"data" + struct.pack("<I", len(body)) + body
    stereo = parse_wav(b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks)
    np.testing.assert_array_equal(stereo.mono(), np.float32([0.375, 0.0, -0.25]))  # dyadic values: exact

    with pytest.raises(WavError):
        parse_wav(b"RIFF\x00\x00\x00\x00WAVEdata\x00\x00\x00\x00")


def test_resampler_properties() -> None:
    # Lengths follow ceil(new * len / orig).
    x = np.random.default_rng(0).standard_normal(1001).astype(np.float32)
    assert F.resample(x, 24000, 16000).shape == (668,)
    assert F.resample(x, 16000, 24000).shape == (1502,)
    assert F.resample(x, 44100, 16000).shape == (364,)
    # A low tone passes with unit gain away from the edges; each kernel phase has unit DC gain.
    t = np.arange(24000) / 24000.0
    tone = np.sin(2 * np.pi * 440 * t).astype(np.float32)
    down = F.resample(tone, 24000, 16000)
    expected = np.sin(2 * np.pi * 440 * np.arange(16000) / 16000.0)
    assert float(np.abs(down[200:-200] - expected[200:-200]).max()) < 2e-3
    kernel, width = F.sinc_resample_kernel(24000, 16000)
    assert kernel.shape == (2, 2 * width + 3) and width == 10
    np.testing.assert_allclose(kernel.sum(axis=1), 1.0, atol=2e-2)  # unit DC gain per phase


def test_slaney_filterbank_shape_and_area() -> None:
    fb = F.slaney_mel_filterbank(16000, 400, 128)
    assert fb.shape == (128, 201) and fb.dtype == np.float32
    assert (fb >= 0).all() and (fb.max(axis=1) > 0).all()
    fb24 = F.slaney_mel_filterbank(24000, 1920, 80)
    # fmax defaults to Nyquist (12 kHz): the top filter reaches close to the last bins.
    assert fb24[-1, -20:].max() > 0

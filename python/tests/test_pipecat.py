"""The package's pipecat example: a pipeline with its CosyTTSService produces audio frames, the
same audio the engine streams for the same request."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

import cosy
from conftest import PROMPT_TEXT, PROMPT_WAV, skip_or_fail

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))


def test_a_pipecat_pipeline_speaks_through_cosy(engine: cosy.Engine) -> None:
    try:
        import pipecat_tts
    except ImportError as e:
        skip_or_fail(f"pipecat is not installed ({e}); python/tests/requirements.txt has it")
        return
    text = "Hello from a pipecat pipeline."
    voice = dict(prompt_wav=str(PROMPT_WAV), prompt_text=PROMPT_TEXT, seed=9)
    frames, errors = asyncio.run(pipecat_tts.speak(engine, text, **voice))
    assert not errors, [e.error for e in errors]
    assert frames, "no audio frames reached the end of the pipeline"
    assert all(f.sample_rate == engine.sample_rate and f.num_channels == 1 for f in frames)
    pcm = np.frombuffer(b"".join(f.audio for f in frames), dtype="<i2")
    streamed = np.concatenate(list(engine.stream(text, **voice)))
    expected = (np.clip(streamed, -1.0, 1.0) * 32767.0).round().astype("<i2")
    assert np.array_equal(pcm, expected)


def test_a_bad_voice_is_an_error_frame(engine: cosy.Engine) -> None:
    try:
        import pipecat_tts
    except ImportError as e:
        skip_or_fail(f"pipecat is not installed ({e})")
        return
    frames, errors = asyncio.run(pipecat_tts.speak(engine, "Hello.", voice="nobody"))
    assert not frames
    assert errors and "nobody" in errors[0].error, [e.error for e in errors]

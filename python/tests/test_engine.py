"""The package against the binary: the same request gives the same samples through `import cosy`
as through `cosy file` (bit for bit: one machine, one library, one seed), whole, streamed and
text-in streamed; each sentence's place in the audio is exact; errors carry the CLI's words."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cosy
from conftest import PROMPT_TEXT, PROMPT_WAV, Home, read_wav_f32

TEXT = "Hello there. The package speaks with the engine of the binary."
# Long enough for the text frontend to make several sentences of it (it joins short ones).
LONG = (
    "The first part of this text is a sentence of very many words, long enough that the text frontend of the engine keeps it as one sentence of its own "
    "and does not join it with the sentence that comes after it, whatever the tokenizer makes of each of these words. "
    "The second part is another long sentence with very many words in it, so that the audio holds two sentences or more, one after the other, "
    "with nothing between them that belongs to neither of the two sentences around it. "
    "And the third part ends the text with a few words."
)


def cli_samples(home: Home, name: str, *args: str, stdin: bytes | None = None) -> np.ndarray:
    out = home.path / f"{name}.wav"
    home.cli("file", *args, "--format", "wavf32", "-o", str(out), stdin=stdin)
    return read_wav_f32(out)


def voice_flags(seed: int) -> list[str]:
    return ["--prompt-wav", str(PROMPT_WAV), "--prompt-text", PROMPT_TEXT, "--seed", str(seed)]


def test_synthesize_equals_cosy_file(engine: cosy.Engine, home: Home) -> None:
    audio = engine.synthesize(LONG, prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT, seed=7)
    expected = cli_samples(home, "whole", LONG, *voice_flags(7))
    assert audio.samples.dtype == np.float32 and audio.sample_rate == 24000
    assert len(audio.samples) == len(expected) > 0
    assert np.array_equal(audio.samples, expected), "the package's samples differ from cosy file's"
    # Each sentence's span, in order, end to end: exactly the audio.
    assert len(audio.sentences) >= 2, audio.sentences
    assert audio.sentences[0].start_sample == 0
    for a, b in zip(audio.sentences, audio.sentences[1:]):
        assert a.end_sample == b.start_sample
    assert audio.sentences[-1].end_sample == len(audio.samples)
    assert all(s.text.strip() for s in audio.sentences)
    s = audio.summary
    assert s["samples"] == len(audio.samples) and s["sample_rate"] == 24000
    assert s["usage"]["output_tokens"] > 0 and s["usage"]["input_tokens"] > 0
    assert set(s["stages"]) == {"queue", "load", "frontend", "llm", "flow", "hift"}


def test_stream_chunks_equal_the_streaming_cosy_file(engine: cosy.Engine, home: Home) -> None:
    with engine.stream(TEXT, prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT, seed=3) as s:
        chunks = list(s)
        summary = s.summary
    assert len(chunks) > 1, "a streamed request comes in several chunks"
    expected = cli_samples(home, "streamed", TEXT, "--stream", *voice_flags(3))
    assert np.array_equal(np.concatenate(chunks), expected)
    assert summary is not None and summary["chunks"] == len(chunks)


def test_text_stream_equals_cosy_file_bistream(engine: cosy.Engine, home: Home) -> None:
    text = "Text from a language model, spoken as it comes."
    with engine.text_stream(prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT, seed=5, text_frontend=False) as ts:
        ts.write(text)
        ts.close()
        got = np.concatenate(list(ts))
    # One write of the whole text is one piece for the binary too.
    expected = cli_samples(home, "bistream", "-", "--bistream", "--stream", "--no-text-frontend", *voice_flags(5), stdin=text.encode())
    assert np.array_equal(got, expected)


def test_text_stream_takes_pieces_from_another_thread(engine: cosy.Engine) -> None:
    import threading

    ts = engine.text_stream(prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT, seed=5)

    def writer() -> None:
        for word in "A language model writes this reply word by word .".split():
            ts.write(word + " ")
        ts.close()

    t = threading.Thread(target=writer)
    t.start()
    samples = np.concatenate(list(ts))
    t.join()
    assert len(samples) > 0 and np.isfinite(samples).all()
    assert ts.sentences and ts.sentences[-1].end_sample == len(samples)


def test_leaving_a_stream_early_frees_the_slot(engine: cosy.Engine) -> None:
    for chunk in engine.stream(TEXT * 3, prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT, seed=1):
        assert len(chunk) > 0
        break
    wait_idle(engine)
    ts = engine.text_stream(prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT)
    ts.write("Never finished")
    ts.cancel()
    del ts
    wait_idle(engine)


def wait_idle(engine: cosy.Engine) -> None:
    """Waits until the engine has no request in flight (a cancelled request ends at its next
    token or chunk; the bound only guards against a hang)."""
    import time

    deadline = time.monotonic() + 120
    while engine.stats()["in_flight"] or engine.stats()["queued"]:
        assert time.monotonic() < deadline, f"requests still in flight: {engine.stats()}"
        time.sleep(0.05)


@pytest.mark.parametrize(
    "kwargs, flags",
    [
        ({"voice": "nobody"}, ["--voice", "nobody"]),
        ({"prompt_wav": "/nonexistent/x.wav", "prompt_text": PROMPT_TEXT}, ["--prompt-wav", "/nonexistent/x.wav", "--prompt-text", PROMPT_TEXT]),
        ({"speed": 9.0, "voice": "x"}, ["--speed", "9", "--voice", "x"]),
    ],
)
def test_bad_input_raises_the_message_the_cli_prints(engine: cosy.Engine, home: Home, kwargs: dict, flags: list) -> None:
    with pytest.raises(cosy.CosyError) as raised:
        engine.synthesize("Hello.", **kwargs)
    out = home.cli("file", "Hello.", *flags, "-o", str(home.path / "bad.wav"), check=False)
    assert out.returncode != 0
    stderr = out.stderr.decode()
    assert str(raised.value) in stderr, f"{raised.value!s} not in {stderr!r}"
    assert not (home.path / "bad.wav").exists()


def test_errors_carry_code_and_param(engine: cosy.Engine) -> None:
    with pytest.raises(cosy.InputError) as raised:
        engine.synthesize("x" * 200_000, prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT)
    assert raised.value.kind == "input" and raised.value.code == "text_too_long"
    with pytest.raises(cosy.InputError) as raised:
        engine.synthesize("Hello.", prompt_wav=PROMPT_WAV, prompt_audio=b"RIFF", prompt_text=PROMPT_TEXT)
    assert raised.value.code == "conflicting_fields" and raised.value.param == "prompt_audio"
    with pytest.raises(cosy.ConfigError):
        cosy.Engine(Path(__file__).parents[2] / "tests/fixtures/tiny", runtime={"no_such_key": 1})


def test_voices_add_list_default_remove(engine: cosy.Engine, home: Home) -> None:
    path = engine.voices.add("anna", PROMPT_TEXT, PROMPT_WAV, default=True)
    assert Path(path).is_file()
    listed = {v.name: v for v in engine.voices.list()}
    assert listed["anna"].transcript == PROMPT_TEXT and listed["anna"].is_default and listed["anna"].fits_model
    assert engine.voices.default() == "anna"
    # The binary sees the same folder and the same voice.
    out = home.cli("voice", "list")
    assert "anna" in out.stdout.decode()
    a = engine.synthesize("A saved voice.", voice="anna", seed=2)
    b = engine.synthesize("A saved voice.", seed=2)  # the default voice
    assert np.array_equal(a.samples, b.samples)
    assert engine.voices.add("bob", PROMPT_TEXT, prompt_audio=PROMPT_WAV.read_bytes())
    assert engine.voices.remove("anna") is True
    assert engine.voices.default() is None
    assert [v.name for v in engine.voices.list()] == ["bob"]
    with pytest.raises(cosy.InputError) as raised:
        engine.voices.remove("anna")
    assert raised.value.code == "voice_not_found"
    engine.voices.remove("bob")


def test_onnxruntime_comes_from_the_python_package(engine: cosy.Engine) -> None:
    rt = engine.onnxruntime
    assert rt is not None
    library, version, how = rt
    expected = cosy.onnxruntime_library()
    assert expected is not None, "the onnxruntime package is a dependency of the wheel"
    assert Path(library).resolve() == Path(expected).resolve(), rt
    assert how == "runtime.ort_library" and version.startswith("1.")

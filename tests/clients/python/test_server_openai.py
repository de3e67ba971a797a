"""Acceptance tests of `cosy serve` through the official `openai` Python client: the bundled tiny
model behind the server, a saved voice `me`, and every answer checked against what the command
line writes for the same text, voice and seed (random weights: the audio is noise, but the same
noise for the same seed, so equal bytes prove the server runs the same synthesis)."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import API_KEY, PROMPT_WAV, SAMPLE_RATE, Server, Work, openai, serve

REF_TEXT = "This recording is the voice prompt."
INSTRUCTIONS = "Speak slowly and calmly."
# Three sentences; with the tiny model and SEED, 1.7 s of audio in two streaming chunks (other texts
# may stop after a token or two: the weights are random).
TEXT = "The quick brown fox jumps over the lazy dog. She sells sea shells by the sea shore. How much wood would a woodchuck chuck?"
SHORT = "Hello."
# (With ref_audio and instructions, "Hello." gives no speech token at SEED: a 400 that names it.)
INSTRUCT_TEXT = "Good morning."
SEED = 3



@pytest.fixture(scope="module")
def server(work: Work) -> Iterator[Server]:
    with serve(work, "server") as s:
        yield s


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[openai.OpenAI]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="module")
def cli_wav(work: Work) -> bytes:
    return work.cli_audio("cli.wav", TEXT, "--voice", "me", "--seed", str(SEED))


@pytest.fixture(scope="module")
def cli_stream_pcm(work: Work) -> bytes:
    return work.cli_audio("cli-stream.pcm", TEXT, "--voice", "me", "--seed", str(SEED), "--stream", "--format", "pcm")


def _speech(client: openai.OpenAI, *, voice: Any = "me", text: str = TEXT, response_format: str = "wav",
            extra: dict[str, Any] | None = None, **kwargs: Any) -> bytes:
    """`client.audio.speech.create` of a whole file (`stream: false`: the server streams by default), the body."""
    response = client.audio.speech.create(model="cosyvoice3", voice=voice, input=text, response_format=response_format,
                                          extra_body={"seed": SEED, "stream": False, **(extra or {})}, **kwargs)
    return response.content


def _wav_frames(data: bytes) -> bytes:
    """The 16-bit samples of a 24 kHz mono wav (asserting that it is one)."""
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE, 1, 2)
        frames = w.readframes(w.getnframes())
    assert len(frames) > 0
    return frames


def _data_url(path: Path) -> str:
    return "data:audio/wav;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _assert_still_serves(client: openai.OpenAI) -> None:
    _wav_frames(_speech(client, text=SHORT))


def test_models_lists_cosyvoice3(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["cosyvoice3"]


def test_wav_equals_cosy_file(client: openai.OpenAI, cli_wav: bytes) -> None:
    got = _speech(client)
    _wav_frames(got)
    assert got == cli_wav


def test_voice_object_and_default_name_pick_the_saved_voice(client: openai.OpenAI) -> None:
    by_name = _speech(client, text=SHORT)
    assert _speech(client, text=SHORT, voice={"id": "me"}) == by_name
    assert _speech(client, text=SHORT, voice="default") == by_name


def test_openai_voice_names_speak_with_the_default_voice_and_say_so(client: openai.OpenAI) -> None:
    # pipecat and LiveKit send only OpenAI's names: with no saved voice or alias of that name,
    # the default voice ("me" here), named in x-cosy-voice.
    by_name = _speech(client, text=SHORT)
    for voice in ("alloy", "cedar", {"id": "nova"}):
        raw = client.audio.speech.with_raw_response.create(model="tts-1", voice=voice, input=SHORT, response_format="wav",
                                                           extra_body={"seed": SEED, "stream": False})
        name = voice["id"] if isinstance(voice, dict) else voice
        assert raw.headers.get("x-cosy-voice") == f"me (default voice, for {name})"
        assert raw.content == by_name


def test_extra_fields_are_accepted_and_named(client: openai.OpenAI) -> None:
    # The SDK passes extra_body keys through as top-level fields; the server names what it ignored.
    raw = client.audio.speech.with_raw_response.create(model="cosyvoice3", voice="me", input=SHORT, response_format="wav",
                                                       extra_body={"seed": SEED, "stream": False, "temperature": 0.7, "lang": "en"})
    assert sorted(raw.headers.get("x-cosy-ignored-fields", "").split(", ")) == ["lang", "temperature"]
    assert raw.content == _speech(client, text=SHORT)
    with pytest.raises(openai.BadRequestError) as err:
        _speech(client, text=SHORT, extra={"seed": "seven"})
    assert "seed" in err.value.message
    _assert_still_serves(client)


def _stream_chunks(client: openai.OpenAI, **kwargs: Any) -> tuple[list[bytes], str]:
    """A streamed speech request: the body chunks as they arrived and the content type."""
    with client.audio.speech.with_streaming_response.create(model="cosyvoice3", voice="me", input=TEXT, **kwargs) as r:
        assert r.status_code == 200
        return [c for c in r.iter_bytes() if c], r.headers.get("content-type", "")


def test_streamed_pcm_equals_cosy_file_stream(client: openai.OpenAI, cli_stream_pcm: bytes) -> None:
    chunks, content_type = _stream_chunks(client, response_format="pcm", extra_body={"stream": True, "seed": SEED})
    assert content_type.startswith("audio/pcm")
    assert len(chunks) > 1, "TEXT should arrive in several chunks"
    assert b"".join(chunks) == cli_stream_pcm


def test_streamed_wav_is_header_then_the_streamed_pcm(client: openai.OpenAI, cli_stream_pcm: bytes) -> None:
    chunks, content_type = _stream_chunks(client, response_format="wav", extra_body={"stream": True, "seed": SEED})
    assert content_type.startswith("audio/wav")
    body = b"".join(chunks)
    assert body[:4] == b"RIFF" and body[8:16] == b"WAVEfmt "
    assert body.endswith(cli_stream_pcm) and len(body) - len(cli_stream_pcm) == 44


def _sse_events(client: openai.OpenAI, **kwargs: Any) -> list[dict[str, Any]]:
    with client.audio.speech.with_streaming_response.create(model="cosyvoice3", voice="me", input=TEXT, stream_format="sse",
                                                            **kwargs) as r:
        assert r.status_code == 200
        assert r.headers.get("content-type", "").startswith("text/event-stream")
        return [json.loads(line[len("data:"):]) for line in r.iter_lines() if line.startswith("data:")]


def test_sse_deltas_equal_the_streamed_pcm(client: openai.OpenAI, cli_stream_pcm: bytes) -> None:
    events = _sse_events(client, response_format="pcm", extra_body={"stream": True, "seed": SEED})
    assert len(events) >= 2
    *deltas, done = events
    assert len(deltas) > 1 and {e["type"] for e in deltas} == {"speech.audio.delta"}
    assert done["type"] == "speech.audio.done", done
    pcm = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert pcm == cli_stream_pcm
    assert done["audio_seconds"] == pytest.approx(len(pcm) / 2 / SAMPLE_RATE)
    usage = done["usage"]  # OpenAI's shape: text tokens in, speech tokens out
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_default_is_streamed_mp3_as_openai_clients_expect(client: openai.OpenAI) -> None:
    """What the SDKs send when the caller names no format and no stream: mp3, streamed."""
    with client.audio.speech.with_streaming_response.create(model="tts-1", voice="me", input=TEXT,
                                                            extra_body={"seed": SEED}) as r:
        assert r.status_code == 200
        assert r.headers.get("content-type", "").startswith("audio/mpeg")
        assert r.headers.get("x-cosy-stream") == "chunks"
        body = b"".join(r.iter_bytes())
    # MPEG audio frames from the first byte (no ID3 tag): the frame sync.
    assert body[0] == 0xFF and body[1] & 0xE0 == 0xE0
    # Opus in Ogg, as OpenAI sends it; OpenAI's speed extremes are accepted (spoken at cosy's 0.5 to 2).
    opus = _speech(client, text=SHORT, response_format="opus")
    assert opus[:4] == b"OggS" and opus[28:36] == b"OpusHead"
    raw = client.audio.speech.with_raw_response.create(model="tts-1", voice="me", input=TEXT, response_format="pcm", speed=4.0,
                                                      extra_body={"seed": SEED})
    assert raw.headers.get("x-cosy-speed") == "2" and raw.headers.get("x-cosy-stream") == "sentences"
    assert len(raw.content) > 0


def test_cloning_through_extra_body_equals_cosy_file(work: Work, client: openai.OpenAI) -> None:
    got = _speech(client, voice="unused-with-ref-audio", extra={"ref_audio": _data_url(PROMPT_WAV), "ref_text": REF_TEXT})
    _wav_frames(got)
    want = work.cli_audio("cli-clone.wav", TEXT, "--prompt-wav", str(PROMPT_WAV), "--prompt-text", REF_TEXT, "--seed", str(SEED))
    assert got == want


def test_instructions_with_ref_audio_equal_cosy_file(work: Work, client: openai.OpenAI) -> None:
    got = _speech(client, text=INSTRUCT_TEXT, instructions=INSTRUCTIONS, extra={"ref_audio": _data_url(PROMPT_WAV)})
    _wav_frames(got)
    want = work.cli_audio("cli-instruct.wav", INSTRUCT_TEXT, "--prompt-wav", str(PROMPT_WAV), "--instruct", INSTRUCTIONS,
                          "--seed", str(SEED))
    assert got == want


def _flac_streaminfo(data: bytes) -> tuple[int, int, int, int, bytes]:
    """(sample rate, channels, bits per sample, total samples, MD5) of a FLAC stream's STREAMINFO."""
    assert data[:4] == b"fLaC"
    assert data[4] & 0x7F == 0 and int.from_bytes(data[5:8], "big") == 34, "STREAMINFO must come first"
    info = data[8:42]
    bits = int.from_bytes(info[10:18], "big")
    rate, channels, depth, total = bits >> 44, ((bits >> 41) & 0x7) + 1, ((bits >> 36) & 0x1F) + 1, bits & ((1 << 36) - 1)
    return rate, channels, depth, total, info[18:34]


def test_flac_holds_the_wav_samples(client: openai.OpenAI, cli_wav: bytes) -> None:
    flac = _speech(client, response_format="flac")
    pcm = _wav_frames(cli_wav)
    rate, channels, depth, total, md5 = _flac_streaminfo(flac)
    assert (rate, channels, depth, total) == (SAMPLE_RATE, 1, 16, len(pcm) // 2)
    # The MD5 of the unencoded samples (s16le for 16-bit mono; FLAC allows zero, but this encoder fills it in):
    # lossless, the very samples of the wav.
    assert md5 == hashlib.md5(pcm).digest()
    # Noise barely compresses: between a quarter of the raw samples and the raw samples plus frame overhead.
    assert len(pcm) // 4 < len(flac) < len(pcm) * 1.1 + 4096


def test_unknown_voice_is_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        _speech(client, text=SHORT, voice="nobody")
    assert "nobody" in err.value.message
    assert (err.value.status_code, err.value.code, err.value.param) == (404, "voice_not_found", "voice")
    _assert_still_serves(client)


def test_aac_is_a_bad_request(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _speech(client, text=SHORT, response_format="aac")
    assert (err.value.code, err.value.param, err.value.type) == ("unsupported_response_format", "response_format",
                                                                 "invalid_request_error")
    assert "mp3, opus, wav, pcm or flac" in err.value.message
    _assert_still_serves(client)


def test_wrong_api_key_is_refused(auth_server: Server) -> None:
    with auth_server.client(api_key="sk-wrong") as wrong:
        with pytest.raises(openai.AuthenticationError) as err:
            _speech(wrong, text=SHORT)
    assert (err.value.status_code, err.value.code, err.value.type) == (401, "invalid_api_key", "authentication_error")
    with auth_server.client(api_key=API_KEY) as right:
        _assert_still_serves(right)

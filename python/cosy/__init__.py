"""cosy: CosyVoice3 text-to-speech over ONNX Runtime, from Python.

The same engine as the ``cosy`` binary (one Rust implementation), loaded into this process::

    import cosy

    engine = cosy.Engine("path/to/exported-model")
    audio = engine.synthesize("Hello there.", prompt_wav="me.wav", prompt_text="What me.wav says.")
    audio.save("hello.wav")                      # or use audio.samples (numpy float32)
    for chunk in engine.stream("A longer text, spoken as it is made.", voice="anna"):
        play(chunk)                              # numpy float32, 24 kHz mono

Configuration follows the binary's rules: built-in defaults, then the config file (``config``,
else ``$COSY_CONFIG``, else ``./config.toml``, else the user's), then ``COSY_*`` variables, then
the keyword settings of :class:`Engine`. ONNX Runtime is the library of the installed
``onnxruntime`` (or ``onnxruntime-gpu``) package unless a setting names another.

Waits release the GIL: several threads (or asyncio tasks, through the ``a…`` methods) share one
engine, and their requests are batched as the server's are. Errors are :class:`CosyError`
subclasses with the engine's message (the words the command line prints) and its ``kind``,
``code`` and ``param``.
"""

from __future__ import annotations

import asyncio
import glob
import importlib.util
import os
import wave
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import numpy as np

from . import _cosy
from ._cosy import BusyError, CancelledError, ConfigError, CosyError, InputError, ModelError

__all__ = [
    "Engine",
    "Audio",
    "Sentence",
    "AudioStream",
    "TextStream",
    "AsyncAudioStream",
    "AsyncTextStream",
    "Voices",
    "VoiceInfo",
    "CosyError",
    "InputError",
    "ConfigError",
    "ModelError",
    "BusyError",
    "CancelledError",
    "onnxruntime_library",
]

__version__: str = _cosy.__version__

PathLike = Union[str, "os.PathLike[str]"]


def onnxruntime_library() -> Optional[str]:
    """The ``libonnxruntime`` shared library of the installed ``onnxruntime`` or
    ``onnxruntime-gpu`` package (found without importing it), or ``None``."""
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        # The versioned file (libonnxruntime.so.1.31.1) is the library itself.
        found = sorted(glob.glob(os.path.join(root, "capi", "libonnxruntime.so*")), key=len, reverse=True)
        if found:
            return found[0]
    return None


def _settings(settings: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """Keyword settings as the binary's ``--set KEY=VALUE`` pairs: ``engine={"max_in_flight": 4}``,
    ``engine__max_in_flight=4`` and ``**{"engine.max_in_flight": 4}`` all set
    ``engine.max_in_flight``."""
    pairs: List[Tuple[str, str]] = []

    def add(key: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                add(f"{key}.{k}", v)
        elif isinstance(value, bool):
            pairs.append((key, "true" if value else "false"))
        elif isinstance(value, (list, tuple)):
            pairs.append((key, ",".join(str(v) for v in value)))
        elif value is None:
            pairs.append((key, ""))
        else:
            pairs.append((key, os.fspath(value) if isinstance(value, os.PathLike) else str(value)))

    for key, value in settings.items():
        add(key.replace("__", "."), value)
    return pairs


def _samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<f4").astype(np.float32, copy=False)


@dataclass(frozen=True)
class Sentence:
    """One sentence of the audio: its text as the model got it, and where it lies (exact, in
    samples; in seconds for convenience)."""

    text: str
    start_sample: int
    end_sample: int
    sample_rate: int

    @property
    def start(self) -> float:
        return self.start_sample / self.sample_rate

    @property
    def end(self) -> float:
        return self.end_sample / self.sample_rate


def _sentences(summary: Mapping[str, Any], sample_rate: int) -> List[Sentence]:
    return [Sentence(text, start, start + n, sample_rate) for (text, start, n) in summary.get("sentences", [])]


@dataclass
class Audio:
    """Synthesised speech: mono float32 samples in [-1, 1] at ``sample_rate`` Hz, each sentence's
    place in them, and the request's summary (``usage``, ``audio_seconds``, ``stages`` timing:
    what the server's ``speech.audio.done`` event carries)."""

    samples: np.ndarray
    sample_rate: int
    sentences: List[Sentence] = field(default_factory=list)
    summary: Dict[str, Any] = field(default_factory=dict)

    @property
    def duration(self) -> float:
        """Seconds of audio."""
        return len(self.samples) / self.sample_rate

    def save(self, path: PathLike) -> None:
        """Writes a 16-bit PCM WAV file (the ``cosy`` binary's default format)."""
        pcm = (np.clip(self.samples, -1.0, 1.0) * 32767.0).round().astype("<i2")
        with wave.open(os.fspath(path), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(self.sample_rate)
            w.writeframes(pcm.tobytes())


class AudioStream:
    """The audio of one request, chunk by chunk (numpy float32), as it is made. Iterate it once,
    from one thread. Leaving the loop early and closing it (or using it in ``with``) cancels the
    request and frees its place in the engine; so does Ctrl-C while it waits."""

    def __init__(self, core: Any, sample_rate: int) -> None:
        self._core = core
        self.sample_rate = sample_rate

    def __iter__(self) -> "AudioStream":
        return self

    def __next__(self) -> np.ndarray:
        data = self._core.next_chunk()
        if data is None:
            raise StopIteration
        return _samples(data)

    def _next_or_none(self) -> Optional[np.ndarray]:
        data = self._core.next_chunk()
        return None if data is None else _samples(data)

    def close(self) -> None:
        """Stops the request (if it is still running) and frees its slot."""
        self._core.close()

    def __enter__(self) -> "AudioStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def summary(self) -> Optional[Dict[str, Any]]:
        """The request's summary once the stream is finished, else ``None``."""
        s = self._core.summary(self.sample_rate)
        return None if s is None else dict(s)

    @property
    def sentences(self) -> List[Sentence]:
        """Each sentence's place in the audio, once the stream is finished."""
        s = self.summary
        return [] if s is None else _sentences(s, self.sample_rate)


class TextStream(AudioStream):
    """Text-in streaming: :meth:`write` text as it is generated (by a language model, say) and
    iterate the audio, made while the text still comes. :meth:`close` ends the text; the audio
    ends after the last of it is spoken. Each ``write`` is one piece, as the official code
    tokenises pieces. Writing and reading may happen on different threads."""

    def write(self, text: str) -> None:
        """Hands over the next piece of text (never blocks)."""
        self._core.write(text)

    def close(self) -> None:
        """The text is complete (the audio continues to its end)."""
        self._core.close()

    def cancel(self) -> None:
        """Stops the stream at once and frees its slot."""
        self._core.cancel()

    def __exit__(self, *exc: object) -> None:
        self.cancel()


class AsyncAudioStream:
    """:class:`AudioStream` for asyncio: ``async for chunk in stream``. Each wait runs in the
    loop's executor; cancelling the task (or ``aclose``) cancels the request."""

    def __init__(self, stream: AudioStream) -> None:
        self._stream = stream
        self.sample_rate = stream.sample_rate

    def __aiter__(self) -> "AsyncAudioStream":
        return self

    async def __anext__(self) -> np.ndarray:
        loop = asyncio.get_running_loop()
        try:
            chunk = await loop.run_in_executor(None, self._stream._next_or_none)
        except BaseException:
            self._cancel()
            raise
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    def _cancel(self) -> None:
        self._stream.close()

    async def aclose(self) -> None:
        """Cancels the request if it still runs."""
        self._cancel()

    async def __aenter__(self) -> "AsyncAudioStream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._cancel()

    @property
    def summary(self) -> Optional[Dict[str, Any]]:
        return self._stream.summary

    @property
    def sentences(self) -> List[Sentence]:
        return self._stream.sentences


class AsyncTextStream(AsyncAudioStream):
    """:class:`TextStream` for asyncio: ``write`` and ``close`` do not block; iterate the audio
    with ``async for``."""

    _stream: TextStream

    def write(self, text: str) -> None:
        self._stream.write(text)

    def close(self) -> None:
        """The text is complete."""
        self._stream.close()

    def _cancel(self) -> None:
        self._stream.cancel()


@dataclass(frozen=True)
class VoiceInfo:
    """A saved voice as listed: ``problem`` says why one cannot be used (then ``transcript`` is
    ``None``); ``fits_model`` whether it was made for the engine's model."""

    name: str
    transcript: Optional[str]
    problem: Optional[str]
    is_default: bool
    fits_model: Optional[bool]
    seconds: float


class Voices:
    """The saved voices of the engine's voices folder (``voices.dir``), the same folder and files
    as ``cosy voice``."""

    def __init__(self, core: Any) -> None:
        self._core = core

    def list(self) -> List[VoiceInfo]:
        """Every saved voice, sorted by name."""
        return [VoiceInfo(*entry) for entry in self._core.voices_list()]

    def add(
        self,
        name: str,
        transcript: str,
        prompt_wav: Optional[PathLike] = None,
        *,
        prompt_audio: Optional[bytes] = None,
        replace: bool = False,
        default: bool = False,
    ) -> str:
        """Makes voice ``name`` from a recording (a file, or its bytes in any format the CLI
        reads) and what it says; returns the voice file's path."""
        path = None if prompt_wav is None else os.fspath(prompt_wav)
        return os.fspath(self._core.voices_add(name, transcript, path, prompt_audio, replace, default))

    def remove(self, name: str) -> bool:
        """Deletes voice ``name``; returns whether it was the default (now cleared)."""
        return bool(self._core.voices_remove(name))

    def default(self, name: Optional[str] = None) -> Optional[str]:
        """The default voice's name; with ``name``, makes that voice the default first."""
        if name is not None:
            self._core.voices_set_default(name)
        return self._core.voices_default()


class Engine:
    """One loaded model, shared by every thread and task of this process.

    Args:
        model: the exported model folder (``model.dir``); default: the configured one.
        config: a config file (as ``cosy --config``).
        ort_library: ``libonnxruntime.so`` to load; default: ``runtime.ort_library`` or
            ``ORT_DYLIB_PATH`` when set, else the ``onnxruntime`` package's.
        **settings: any config key, as ``section={"key": value}``, ``section__key=value`` or
            ``**{"section.key": value}`` (as ``cosy --set``).

    ``_test_llm_gather_first`` is the engine's test hook: the first LLM step waits until that
    many sentences wait, so that a test sees requests batched whatever the machine's timing.
    """

    def __init__(
        self,
        model: Optional[PathLike] = None,
        config: Optional[PathLike] = None,
        *,
        ort_library: Optional[PathLike] = None,
        _test_llm_gather_first: int = 0,
        **settings: Any,
    ) -> None:
        library = os.fspath(ort_library) if ort_library is not None else onnxruntime_library()
        pairs = _settings(settings)
        if ort_library is not None:
            pairs.append(("runtime.ort_library", os.fspath(ort_library)))
        self._core = _cosy.EngineCore(
            None if model is None else os.fspath(model),
            None if config is None else os.fspath(config),
            pairs,
            library,
            _test_llm_gather_first,
        )
        self.voices = Voices(self._core)

    @property
    def sample_rate(self) -> int:
        """The audio's sample rate (24000 for CosyVoice3)."""
        return int(self._core.sample_rate)

    @property
    def model_dir(self) -> str:
        """The model folder in use."""
        return os.fspath(self._core.model_dir)

    @property
    def onnxruntime(self) -> Optional[Tuple[str, str, str]]:
        """The ONNX Runtime library loaded: (path, version, how it was found)."""
        rt = self._core.onnxruntime
        return None if rt is None else (os.fspath(rt[0]), rt[1], rt[2])

    def stats(self) -> Dict[str, int]:
        """Requests in flight and queued, and the batchers' counters (``llm_max_rows`` > 1: LLM
        steps of several requests ran as one call)."""
        return dict(self._core.stats())

    @staticmethod
    def _voice(voice: Optional[str], prompt_wav: Optional[PathLike], prompt_text: Optional[str], instruct: Optional[str], prompt_audio: Optional[bytes]) -> Dict[str, Any]:
        return {
            "name": voice,
            "prompt_wav": None if prompt_wav is None else os.fspath(prompt_wav),
            "prompt_audio": prompt_audio,
            "prompt_text": prompt_text,
            "instruct": instruct,
        }

    def _start(
        self,
        text: str,
        voice: Optional[str],
        prompt_wav: Optional[PathLike],
        prompt_text: Optional[str],
        instruct: Optional[str],
        prompt_audio: Optional[bytes],
        speed: float,
        seed: Optional[int],
        stream: Optional[bool],
        text_frontend: bool,
        default_stream: bool,
        hold: bool = False,
    ) -> AudioStream:
        v = self._voice(voice, prompt_wav, prompt_text, instruct, prompt_audio)
        core = self._core.start(text, v, speed, seed, stream, text_frontend, default_stream, hold)
        return AudioStream(core, self.sample_rate)

    def synthesize(
        self,
        text: str,
        *,
        voice: Optional[str] = None,
        prompt_wav: Optional[PathLike] = None,
        prompt_text: Optional[str] = None,
        instruct: Optional[str] = None,
        prompt_audio: Optional[bytes] = None,
        speed: float = 1.0,
        seed: Optional[int] = None,
        stream: Optional[bool] = None,
        text_frontend: bool = True,
    ) -> Audio:
        """Speaks ``text`` and returns the whole :class:`Audio` (as ``cosy file``).

        The voice: a saved ``voice`` name (default: the default voice), or a recording
        (``prompt_wav`` file or ``prompt_audio`` bytes) with its ``prompt_text`` (zero-shot) or
        without (cross-lingual), optionally an ``instruct`` text. ``seed`` fixes the sampling
        (the same seed gives the same samples as the binary). ``stream=True`` uses the streaming
        schedule (the audio ``stream`` gives); default: ``streaming.enabled``, as ``cosy file``.
        """
        s = self._start(text, voice, prompt_wav, prompt_text, instruct, prompt_audio, speed, seed, stream, text_frontend, False)
        with s:
            samples = _samples(s._core.read_all())
            summary = s.summary or {}
        return Audio(samples, self.sample_rate, _sentences(summary, self.sample_rate), summary)

    def stream(
        self,
        text: str,
        *,
        voice: Optional[str] = None,
        prompt_wav: Optional[PathLike] = None,
        prompt_text: Optional[str] = None,
        instruct: Optional[str] = None,
        prompt_audio: Optional[bytes] = None,
        speed: float = 1.0,
        seed: Optional[int] = None,
        stream: Optional[bool] = None,
        text_frontend: bool = True,
        _test_hold_after_first_audio: bool = False,
    ) -> AudioStream:
        """Speaks ``text`` chunk by chunk: the first chunk comes while the model still works
        (the streaming schedule, as ``cosy say``; with a ``speed``, sentence by sentence).
        Arguments as :meth:`synthesize`. (``_test_hold_after_first_audio`` is the engine's test
        hook: the request then waits after its first chunk until it is cancelled; it needs the
        setting ``debug={"test_hooks": True}``.)"""
        return self._start(text, voice, prompt_wav, prompt_text, instruct, prompt_audio, speed, seed, stream, text_frontend, True, _test_hold_after_first_audio)

    def text_stream(
        self,
        *,
        voice: Optional[str] = None,
        prompt_wav: Optional[PathLike] = None,
        prompt_text: Optional[str] = None,
        instruct: Optional[str] = None,
        prompt_audio: Optional[bytes] = None,
        seed: Optional[int] = None,
        text_frontend: bool = True,
        normalize_sentences: bool = False,
        stream: Optional[bool] = None,
    ) -> TextStream:
        """A text-in stream (as ``cosy file - --bistream --stream``): ``write`` text as it
        comes, iterate the audio. The voice needs a transcript (``prompt_text``, or a saved
        voice) or an ``instruct`` text. ``normalize_sentences`` normalises each settled sentence
        (numbers, symbols) instead of taking the text as written (the official, exact mode).
        ``stream=False`` turns the streaming schedule off (as ``cosy file - --bistream``)."""
        v = self._voice(voice, prompt_wav, prompt_text, instruct, prompt_audio)
        core = self._core.start_text_stream(v, seed, text_frontend, normalize_sentences, stream)
        return TextStream(core, self.sample_rate)

    async def asynthesize(self, text: str, **kwargs: Any) -> Audio:
        """:meth:`synthesize` for asyncio (cancelling the task cancels the request)."""
        kwargs.setdefault("stream", None)
        s = self._start_async(text, kwargs, default_stream=False)
        chunks = [chunk async for chunk in s]
        samples = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        summary = s.summary or {}
        return Audio(samples, self.sample_rate, _sentences(summary, self.sample_rate), summary)

    def astream(self, text: str, **kwargs: Any) -> AsyncAudioStream:
        """:meth:`stream` for asyncio: ``async for chunk in engine.astream(...)``."""
        return self._start_async(text, kwargs, default_stream=True)

    def atext_stream(self, **kwargs: Any) -> AsyncTextStream:
        """:meth:`text_stream` for asyncio."""
        return AsyncTextStream(self.text_stream(**kwargs))

    def _start_async(self, text: str, kwargs: Dict[str, Any], default_stream: bool) -> AsyncAudioStream:
        a = dict(voice=None, prompt_wav=None, prompt_text=None, instruct=None, prompt_audio=None, speed=1.0, seed=None, stream=None, text_frontend=True)
        unknown = set(kwargs) - set(a)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        a.update(kwargs)
        return AsyncAudioStream(self._start(text, default_stream=default_stream, **a))

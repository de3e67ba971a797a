"""A pipecat TTS service speaking through cosy in the same process (no server): the engine's
streamed audio becomes pipecat's ``TTSAudioRawFrame``s as it is made.

    from pipecat_tts import CosyTTSService
    engine = cosy.Engine("path/to/model")
    tts = CosyTTSService(engine=engine, voice="anna")        # a saved voice, or:
    tts = CosyTTSService(engine=engine, prompt_wav="me.wav", prompt_text="What me.wav says.")
    pipeline = Pipeline([transport.input(), stt, llm, tts, transport.output()])

Run as a script, it speaks one line through a pipeline and writes what pipecat received:

    python pipecat_tts.py MODEL_DIR PROMPT_WAV "PROMPT TEXT" "Text to say." out.wav
"""

from __future__ import annotations

import asyncio
import sys
import wave
from typing import Any, AsyncGenerator, List, Optional, Tuple

import numpy as np
from pipecat.frames.frames import EndFrame, ErrorFrame, Frame, TTSAudioRawFrame, TTSSpeakFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.tts_service import TTSService

import cosy


class CosyTTSService(TTSService):
    """Text to speech with a :class:`cosy.Engine` loaded in this process."""

    def __init__(
        self,
        *,
        engine: cosy.Engine,
        voice: Optional[str] = None,
        prompt_wav: Optional[str] = None,
        prompt_text: Optional[str] = None,
        instruct: Optional[str] = None,
        seed: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("sample_rate", engine.sample_rate)
        super().__init__(push_start_frame=True, push_stop_frames=True, **kwargs)
        self._engine = engine
        self._voice = dict(voice=voice, prompt_wav=prompt_wav, prompt_text=prompt_text, instruct=instruct, seed=seed)

    def can_generate_metrics(self) -> bool:
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame, None]:
        """Streams ``text``'s audio as 16-bit PCM frames at the engine's rate."""
        if self.sample_rate != self._engine.sample_rate:
            yield ErrorFrame(error=f"cosy speaks at {self._engine.sample_rate} Hz; set the service's sample_rate to it (or resample after it)")
            return
        try:
            await self.start_tts_usage_metrics(text)
            async with self._engine.astream(text, **self._voice) as stream:
                async for chunk in stream:
                    await self.stop_ttfb_metrics()
                    pcm = (np.clip(chunk, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()
                    yield TTSAudioRawFrame(audio=pcm, sample_rate=self._engine.sample_rate, num_channels=1, context_id=context_id)
        except cosy.CosyError as e:
            yield ErrorFrame(error=f"cosy: {e}")
        finally:
            await self.stop_ttfb_metrics()


class Collector(FrameProcessor):
    """Keeps the TTS audio frames that pass it, and the error frames (pipecat sends those
    upstream: a collector before the service sees them)."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: List[TTSAudioRawFrame] = []
        self.errors: List[ErrorFrame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            self.frames.append(frame)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame)
        await self.push_frame(frame, direction)


async def speak(engine: cosy.Engine, text: str, **voice: Any) -> Tuple[List[TTSAudioRawFrame], List[ErrorFrame]]:
    """Runs ``text`` through a pipeline [errors, CosyTTSService, audio]; returns the audio frames
    that reached its end and the error frames the service sent up."""
    tts = CosyTTSService(engine=engine, **voice)
    upstream, downstream = Collector(), Collector()
    task = PipelineTask(Pipeline([upstream, tts, downstream]))
    await task.queue_frames([TTSSpeakFrame(text), EndFrame()])
    await PipelineRunner(handle_sigint=False).run(task)
    return downstream.frames, upstream.errors


def main() -> None:
    model, prompt_wav, prompt_text, text, out = sys.argv[1:6]
    engine = cosy.Engine(model)
    frames, errors = asyncio.run(speak(engine, text, prompt_wav=prompt_wav, prompt_text=prompt_text))
    if errors:
        sys.exit(f"pipecat_tts: {errors[0].error}")
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(engine.sample_rate)
        w.writeframes(b"".join(f.audio for f in frames))
    print(f"{out}: {len(frames)} frames")


if __name__ == "__main__":
    main()

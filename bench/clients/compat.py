"""Points pipecat's OpenAITTSService and LiveKit's openai TTS plugin at a running `cosy serve`,
each with its default settings (only base_url and api_key given), and reports what audio each got.

    python bench/clients/compat.py BASE_URL API_KEY [TEXT]

Prints one JSON line per client: {"client", "ok", "settings", "frames", "seconds", "sample_rate",
"error"} and exits 1 if either got no audio."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

TEXT = "Hello, this is cosy speaking."


async def pipecat_run(base_url: str, api_key: str, text: str) -> dict[str, Any]:
    from pipecat.frames.frames import EndFrame, ErrorFrame, Frame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.runner import PipelineRunner
    from pipecat.pipeline.task import PipelineParams, PipelineTask
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.openai.tts import OpenAITTSService

    got: dict[str, Any] = {"client": "pipecat OpenAITTSService", "frames": 0, "bytes": 0, "errors": []}

    class Collect(FrameProcessor):
        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                got["frames"] += 1
                got["bytes"] += len(frame.audio)
                got["sample_rate"] = frame.sample_rate
            elif isinstance(frame, ErrorFrame):
                got["errors"].append(frame.error)
            await self.push_frame(frame, direction)

    tts = OpenAITTSService(api_key=api_key, base_url=base_url)  # defaults: voice alloy, pcm, 24 kHz
    got["settings"] = {"model": str(tts._settings.model), "voice": str(tts._settings.voice)}
    task = PipelineTask(Pipeline([tts, Collect()]), params=PipelineParams(audio_out_sample_rate=24_000))
    await task.queue_frames([TTSSpeakFrame(text), EndFrame()])
    await asyncio.wait_for(PipelineRunner(handle_sigint=False).run(task), timeout=300)
    got["seconds"] = got["bytes"] / 2 / got.get("sample_rate", 24_000)
    got["ok"] = got["bytes"] > 0 and not got["errors"]
    return got


async def livekit_run(base_url: str, api_key: str, text: str) -> dict[str, Any]:
    from livekit.plugins import openai as lk_openai

    tts = lk_openai.TTS(base_url=base_url, api_key=api_key)  # defaults: gpt-4o-mini-tts (sse), ash, mp3
    got: dict[str, Any] = {"client": "livekit-plugins-openai TTS", "frames": 0, "samples": 0,
                           "settings": {"model": tts._opts.model, "voice": tts._opts.voice,
                                        "response_format": tts._opts.response_format}}
    try:
        async with tts.synthesize(text) as stream:
            async for event in stream:
                got["frames"] += 1
                got["samples"] += event.frame.samples_per_channel
                got["sample_rate"] = event.frame.sample_rate
        got["seconds"] = got["samples"] / got.get("sample_rate", 24_000)
        got["ok"] = got["samples"] > 0
    except Exception as e:  # noqa: BLE001 (the report names whatever the plugin raised)
        got["ok"], got["error"] = False, f"{type(e).__name__}: {e} {e.__cause__ or ''}".strip()
    finally:
        await tts.aclose()
    return got


async def main() -> int:
    from loguru import logger  # pipecat's logger: its warnings and errors only

    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    base_url, api_key = sys.argv[1], sys.argv[2]
    text = sys.argv[3] if len(sys.argv) > 3 else TEXT
    ok = True
    for run in (pipecat_run, livekit_run):
        try:
            result = await run(base_url, api_key, text)
        except Exception as e:  # noqa: BLE001
            result = {"client": run.__name__, "ok": False, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(result), flush=True)
        ok = ok and bool(result.get("ok"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))

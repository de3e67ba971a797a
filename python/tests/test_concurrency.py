"""One engine, many Python threads and asyncio tasks: each result equals its solo run (the same
speech tokens, the audio within 2e-3 of its peak: the engine's own promise for batched requests,
tests/pipeline/engine_concurrency.rs; a DiT call over several requests sums in another order than
one over a single request, so the last bits may differ), and the engine batched them (its test hook gathers the first LLM step's rows, so batching does not
depend on this machine's timing). Ctrl-C stops a script's synthesis and frees its slot."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from typing import Dict, List

import numpy as np

import cosy
from conftest import MODEL, PROMPT_TEXT, PROMPT_WAV, Home

TEXTS = [f"Request number {i} is spoken beside the others." for i in range(8)]
# Random weights stop at random points: seeds with which each text makes speech on the tiny model.
SEEDS = [8 + i for i in range(8)]


def test_threads_and_tasks_share_one_engine_and_are_batched(home: Home) -> None:
    engine = cosy.Engine(MODEL, _test_llm_gather_first=8, engine={"max_in_flight": 8}, **home.settings())
    voice = dict(prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT)
    results: Dict[int, cosy.Audio] = {}
    failures: List[BaseException] = []

    def in_thread(i: int) -> None:
        try:
            results[i] = engine.synthesize(TEXTS[i], seed=SEEDS[i], **voice)
        except BaseException as e:  # reported below
            failures.append(e)

    async def in_tasks() -> None:
        audios = await asyncio.gather(*(engine.asynthesize(TEXTS[i], seed=SEEDS[i], **voice) for i in range(4, 8)))
        for i, a in zip(range(4, 8), audios):
            results[i] = a

    threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    asyncio.run(in_tasks())
    for t in threads:
        t.join()
    assert not failures, failures
    stats = engine.stats()
    assert stats["llm_max_rows"] >= 2, f"the requests' LLM steps were not batched: {stats}"
    assert stats["in_flight"] == 0
    # Each alone, after: the same samples.
    for i, text in enumerate(TEXTS):
        solo = engine.synthesize(text, seed=SEEDS[i], **voice)
        together = results[i]
        assert together.summary["usage"] == solo.summary["usage"], f"request {i}: other speech tokens than alone"
        assert len(together.samples) == len(solo.samples) > 0
        peak = float(np.abs(solo.samples).max())
        diff = float(np.abs(together.samples - solo.samples).max())
        assert diff <= 2e-3 * peak, f"request {i}: audio differs from its solo run by {diff} (peak {peak})"


def test_async_stream_and_text_stream(engine: cosy.Engine) -> None:
    voice = dict(prompt_wav=PROMPT_WAV, prompt_text=PROMPT_TEXT)

    async def main() -> None:
        chunks = [c async for c in engine.astream("Streamed into asyncio.", seed=4, **voice)]
        whole = engine.synthesize("Streamed into asyncio.", seed=4, stream=True, **voice)
        assert np.array_equal(np.concatenate(chunks), whole.samples)
        ts = engine.atext_stream(seed=4, **voice)
        ts.write("Written from a task.")
        ts.close()
        got = [c async for c in ts]
        assert got and ts.sentences
        # Leaving early cancels.
        async with engine.astream("A long text " * 20, seed=5, **voice) as s:
            async for _ in s:
                break

    asyncio.run(main())
    import time

    deadline = time.monotonic() + 120
    while engine.stats()["in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


SCRIPT = r"""
import sys, time, cosy
engine = cosy.Engine(sys.argv[1], runtime={"providers": "cpu"}, debug={"test_hooks": True})
# The request holds after its first chunk until it is cancelled: the wait for the second chunk
# lasts until Ctrl-C, whatever the machine's speed.
# `with`: wherever the KeyboardInterrupt lands (in the engine's wait or between two chunks),
# leaving the block cancels the request.
try:
    with engine.stream("Stopped halfway. And never finished.", prompt_wav=sys.argv[2], prompt_text=sys.argv[3],
                       _test_hold_after_first_audio=True) as stream:
        for i, chunk in enumerate(stream):
            if i == 0:
                print("first chunk", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    deadline = time.monotonic() + 120
    while engine.stats()["in_flight"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    print("slot freed", flush=True)
    sys.exit(0)
print("finished without interruption", flush=True)
sys.exit(1)
"""


def test_ctrl_c_stops_synthesis(home: Home) -> None:
    p = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(MODEL), str(PROMPT_WAV), PROMPT_TEXT],
        cwd=home.path,
        env=home.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()  # blocks until the first chunk (or the script ends)
    assert line.strip() == "first chunk", (line, p.stderr.read() if p.poll() is not None else "")
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, (out, err)
    assert out.split() == ["interrupted", "slot", "freed"], (out, err)

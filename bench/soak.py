#!/usr/bin/env python3
"""Soak of `cosy serve` (issue 30): one server on loopback (HTTP, WebSocket, Wyoming) under a bounded
number of clients for a bounded time, every door mixed with cancels, bad requests and slow readers.

Every few seconds it records the server's RSS, open fds and threads (/proc/PID), the engine's
in-flight count and queue (/metrics) and the latency percentiles per door; at the end it writes
NAME.csv, NAME.json, NAME.md and NAME.png and exits non-zero when a check fails:
- flatness: RSS and fds, mean of the first window after warm-up vs the last window, within the
  bound (5 %); fds at rest (no connection open) after warm-up and after the load: equal;
- no unexplained error (every error is either asked for, a bad request sent or a cancel made, or
  unexplained);
- in-flight and queue back to 0 within a bounded wait once the load stops; the server still
  answers, and SIGTERM ends it with status 0.

Windows: for a run of 30 minutes or more, warm-up = 1/6 of it, windows of 10 minutes (the first
after warm-up, the last); a shorter run scales them: the first and last third after a warm-up of 1/6.

Run it through bench/soak.sh (which makes the venv). Randomness is seeded (--seed): the sequence of
operations each client picks is the same run to run (what the server answers when is not).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import csv
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT_WAV = REPO / "tests/fixtures/prompt_24k.wav"
VOICE_TEXT = "Hello there, this is a test."
API_KEY = "sk-cosy-soak"
FORMATS = ("mp3", "opus", "wav", "pcm", "flac")
TEXTS = (
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "A server that runs for weeks must not grow. It must stay flat.",
    "Numbers like 42 and 3.5 are read out loud.",
    "Short one.",
)
# Text-in streaming (the WebSocket, Wyoming's synthesize-start) cannot force speech tokens
# (`min_tokens` is refused there), and the bundled tiny model's random weights stop at once on a
# short text with most seeds ("the LLM produced no speech tokens"): a two-word text, and the second
# sentence of a two-sentence one when the first segment ends early and the rest becomes a segment of
# its own (Wyoming, whose seed is the server's, did so on "It must stay flat."). Those doors take
# the longer one-sentence texts, with the server's seed (with which each of them speaks).
STREAM_TEXTS = (TEXTS[0], TEXTS[1], TEXTS[3])
# Each operation's share of the load (a client draws one after another, seeded).
WEIGHTS = {
    "http_whole": 12, "http_stream": 12, "http_slow": 5, "sse": 10, "ws": 10, "wyoming_stream": 8,
    "wyoming_synth": 5, "voices": 6, "cancel": 14, "bad": 18,
}


def in_ci() -> bool:
    return os.environ.get("CI", "") not in ("", "0", "false")


# --- outcomes ---------------------------------------------------------------------------------------

class Unexplained(Exception):
    """An answer the request did not ask for (a wrong status, a broken stream, a missing event)."""


@dataclass
class Stats:
    """Everything the clients observed: latencies per door, outcomes, errors by kind."""

    latencies: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: defaultdict(list))
    ops: Counter[str] = field(default_factory=Counter)
    asked: Counter[str] = field(default_factory=Counter)
    unexplained: Counter[str] = field(default_factory=Counter)
    unexplained_examples: list[str] = field(default_factory=list)

    def latency(self, door: str, seconds: float) -> None:
        self.latencies[door].append((time.monotonic(), seconds))

    def error(self, kind: str, message: str) -> None:
        self.unexplained[kind] += 1
        print(f"soak: unexplained {kind}: {message[:300]}", file=sys.stderr, flush=True)
        if len(self.unexplained_examples) < 20:
            self.unexplained_examples.append(f"{kind}: {message}"[:300])


# --- a raw HTTP/1.1 client (every socket state is ours to cut) -------------------------------------

@dataclass
class Response:
    status: int
    headers: dict[str, str]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    async def pieces(self, piece: int = 1 << 16) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked, sized or until close), at most `piece` bytes at a time."""
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                line = await self.reader.readline()
                if not line.endswith(b"\n"):
                    raise Unexplained("chunked body cut before its last chunk")
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                while size:
                    part = await self.reader.readexactly(min(size, piece))
                    size -= len(part)
                    yield part
                await self.reader.readexactly(2)
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left:
                part = await self.reader.readexactly(min(left, piece))
                left -= len(part)
                yield part
        else:
            while part := await self.reader.read(piece):
                yield part

    async def body(self) -> bytes:
        return b"".join([p async for p in self.pieces()])

    def close(self) -> None:
        self.writer.close()


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    wyoming_port: int


async def send_request(t: Target, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                       *, auth: str | None = API_KEY, send_body: int | None = None) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Opens a connection and writes a request (Connection: close); `send_body` bytes of the body only."""
    reader, writer = await asyncio.open_connection(t.host, t.port)
    head = {"Host": f"{t.host}:{t.port}", "Connection": "close", "Content-Length": str(len(body)), **(headers or {})}
    if auth is not None:
        head["Authorization"] = f"Bearer {auth}"
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in head.items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
    writer.write(body if send_body is None else body[:send_body])
    await writer.drain()
    return reader, writer


async def read_head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Response:
    status_line = await reader.readline()
    m = re.match(rb"HTTP/1\.1 (\d{3})", status_line)
    if not m:
        raise Unexplained(f"no status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return Response(int(m.group(1)), headers, reader, writer)


async def request(t: Target, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                  *, auth: str | None = API_KEY) -> Response:
    reader, writer = await send_request(t, method, path, body, headers, auth=auth)
    return await read_head(reader, writer)


@dataclass(frozen=True)
class Hooks:
    """The test hooks a request carries (debug.test_hooks; docs/server.md "For tests"): `min_tokens`
    makes the bundled random model speak (whole-text requests only), `max_tokens` bounds a full-size
    random model, which never stops by itself."""

    min_tokens: int = 0
    max_tokens: int = 0

    def whole(self) -> dict[str, object]:
        """For a request with its whole text (HTTP, Wyoming's synthesize)."""
        hooks = {"min_tokens": self.min_tokens, "max_tokens": self.max_tokens}
        return {"cosy_test": {k: v for k, v in hooks.items() if v}} if any(hooks.values()) else {}

    def streaming(self) -> dict[str, object]:
        """For text-in streaming (the WebSocket, Wyoming's synthesize-start), which refuses min_tokens."""
        return {"cosy_test": {"max_tokens": self.max_tokens}} if self.max_tokens else {}

    @property
    def enabled(self) -> bool:
        return bool(self.min_tokens or self.max_tokens)


def speech_body(rng: random.Random, hooks: Hooks, **fields: object) -> bytes:
    obj = {"input": rng.choice(TEXTS), "voice": "me", "seed": rng.randrange(1 << 20), **fields, **hooks.whole()}
    return json.dumps(obj).encode()


JSON = {"Content-Type": "application/json"}
MAGIC = {"wav": b"RIFF", "flac": b"fLaC", "opus": b"OggS"}


def check_audio(fmt: str, data: bytes) -> None:
    if not data:
        raise Unexplained(f"{fmt}: empty body")
    if fmt in MAGIC and not data.startswith(MAGIC[fmt]):
        raise Unexplained(f"{fmt}: body starts with {data[:4]!r}")
    if fmt == "pcm" and len(data) % 2:
        raise Unexplained("pcm: odd byte count")


async def expect_status(resp: Response, status: int, what: str) -> bytes:
    body = await resp.body()
    if resp.status != status:
        raise Unexplained(f"{what}: status {resp.status}, wanted {status}: {body[:200]!r}")
    return body


# --- the operations ---------------------------------------------------------------------------------

@dataclass
class Client:
    t: Target
    rng: random.Random
    stats: Stats
    hooks: Hooks
    index: int
    # Each operation's bound: past it, an unexplained error (a request the server never answered).
    timeout_s: float
    voice_counter: int = 0

    async def http_whole(self) -> None:
        fmt = self.rng.choice(FORMATS)
        start = time.monotonic()
        resp = await request(self.t, "POST", "/v1/audio/speech", speech_body(self.rng, self.hooks, response_format=fmt, stream=False), JSON)
        try:
            check_audio(fmt, await expect_status(resp, 200, f"whole {fmt}"))
        finally:
            resp.close()
        self.stats.latency("http_whole", time.monotonic() - start)

    async def http_stream(self, slow: bool = False) -> None:
        fmt = self.rng.choice(FORMATS)
        start = time.monotonic()
        resp = await request(self.t, "POST", "/v1/audio/speech", speech_body(self.rng, self.hooks, response_format=fmt), JSON)
        try:
            if resp.status != 200:
                raise Unexplained(f"streamed {fmt}: status {resp.status}: {(await resp.body())[:200]!r}")
            data = bytearray()
            first: float | None = None
            # A slow reader takes 4 KB every 100 ms (40 KB/s, below pcm's 48 KB/s of real time):
            # the server must wait for it (backpressure), not buffer without bound or cut it off.
            async for part in resp.pieces(4096 if slow else 1 << 16):
                if first is None:
                    first = time.monotonic() - start
                data += part
                if slow:
                    await asyncio.sleep(0.1)
            check_audio(fmt, bytes(data))
        finally:
            resp.close()
        self.stats.latency("http_slow" if slow else "http_stream", first or 0.0)

    async def sse(self) -> None:
        fmt = self.rng.choice(FORMATS)
        start = time.monotonic()
        resp = await request(self.t, "POST", "/v1/audio/speech",
                             speech_body(self.rng, self.hooks, response_format=fmt, stream_format="sse"), JSON)
        try:
            text = (await expect_status(resp, 200, f"sse {fmt}")).decode()
        finally:
            resp.close()
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        types = [e.get("type") for e in events]
        if "speech.audio.delta" not in types or types[-1] != "speech.audio.done":
            raise Unexplained(f"sse {fmt}: events {types[:5]}…{types[-2:]}")
        # The first delta's time is not visible once the body is read whole; the done event says it.
        self.stats.latency("sse", float(events[-1].get("timing", {}).get("first_audio_s", time.monotonic() - start)))

    async def ws(self, cancel: bool = False) -> None:
        from websockets.asyncio.client import connect

        start = time.monotonic()
        url = f"ws://{self.t.host}:{self.t.port}/v1/audio/speech/stream"
        async with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, max_size=None, open_timeout=60) as ws:
            # The server's seed and normalised text, as Wyoming's stream (the same audio for the same
            # pieces): a random seed made the tiny model stop at once in about 1 session in 12.
            await ws.send(json.dumps({"type": "session.config", "voice": "me", "normalize": True, **self.hooks.streaming()}))
            created = json.loads(await ws.recv())
            if created.get("type") != "session.created":
                raise Unexplained(f"ws: first event {created}")
            for word in self.rng.choice(STREAM_TEXTS).split():
                await ws.send(json.dumps({"type": "input.text", "text": word + " "}))
            await ws.send(json.dumps({"type": "input.done"}))
            first: float | None = None
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    if first is None:
                        first = time.monotonic() - start
                        if cancel:
                            return  # closes the socket mid-stream
                    continue
                event = json.loads(msg)
                if event.get("type") == "error":
                    raise Unexplained(f"ws: {event}")
                if event.get("type") == "session.done":
                    break
        if not cancel:
            self.stats.latency("ws", first or 0.0)

    async def wyoming(self, streaming: bool, cancel: bool = False) -> None:
        from wyoming.event import Event, async_read_event, async_write_event

        start = time.monotonic()
        reader, writer = await asyncio.open_connection(self.t.host, self.t.wyoming_port)
        try:
            text = self.rng.choice(STREAM_TEXTS if streaming else TEXTS)
            if streaming:
                await async_write_event(Event("synthesize-start", {"voice": {"name": "me"}, **self.hooks.streaming()}), writer)
                for word in text.split():
                    await async_write_event(Event("synthesize-chunk", {"text": word + " "}), writer)
                await async_write_event(Event("synthesize", {"text": text, "voice": {"name": "me"}}), writer)
                await async_write_event(Event("synthesize-stop"), writer)
                last = "synthesize-stopped"
            else:
                data: dict[str, object] = {"text": text, "voice": {"name": "me"}}
                data.update(self.hooks.whole())
                await async_write_event(Event("synthesize", data), writer)
                last = "audio-stop"
            first: float | None = None
            while True:
                event = await async_read_event(reader)
                if event is None:
                    raise Unexplained("wyoming: connection closed before " + last)
                if event.type == "error":
                    raise Unexplained(f"wyoming: {event.data}")
                if event.type == "audio-chunk" and first is None:
                    first = time.monotonic() - start
                    if cancel:
                        return
                if event.type == last:
                    break
        finally:
            writer.close()
        if not cancel:
            self.stats.latency("wyoming_stream" if streaming else "wyoming_synth", first or 0.0)

    def voice_upload(self, name: str) -> tuple[bytes, dict[str, str]]:
        boundary = f"soak{self.rng.randrange(1 << 30):x}"
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'.encode(),
            f'--{boundary}\r\nContent-Disposition: form-data; name="ref_text"\r\n\r\n{VOICE_TEXT}\r\n'.encode(),
            f'--{boundary}\r\nContent-Disposition: form-data; name="audio_sample"; filename="p.wav"\r\n'
            "Content-Type: audio/wav\r\n\r\n".encode() + PROMPT_WAV.read_bytes() + b"\r\n",
            f"--{boundary}--\r\n".encode(),
        ]
        return b"".join(parts), {"Content-Type": f"multipart/form-data; boundary={boundary}"}

    async def voices(self) -> None:
        self.voice_counter += 1
        name = f"soak-{self.index}-{self.voice_counter}"
        body, headers = self.voice_upload(name)
        start = time.monotonic()
        resp = await request(self.t, "POST", "/v1/audio/voices", body, headers)
        await expect_status(resp, 201, f"voice add {name}")
        resp.close()
        self.stats.latency("voice_add", time.monotonic() - start)
        resp = await request(self.t, "GET", "/v1/audio/voices")
        listing = json.loads(await expect_status(resp, 200, "voice list"))
        resp.close()
        if name not in [v.get("name") for v in listing.get("data", [])]:
            raise Unexplained(f"voice list lacks {name}")
        resp = await request(self.t, "DELETE", f"/v1/audio/voices/{name}")
        await expect_status(resp, 200, f"voice rm {name}")
        resp.close()

    async def cancel(self) -> str:
        """Cuts a request at a random point; returns the kind (an "asked" error)."""
        kind = self.rng.choice(["before_first_byte", "mid_stream", "voice_upload", "ws_mid_stream", "wyoming_mid_stream"])
        if kind == "before_first_byte":
            reader, writer = await send_request(self.t, "POST", "/v1/audio/speech", speech_body(
                self.rng, self.hooks, response_format=self.rng.choice(FORMATS)), JSON)
            await asyncio.sleep(self.rng.uniform(0, 0.05))
            writer.close()
        elif kind == "mid_stream":
            resp = await request(self.t, "POST", "/v1/audio/speech", speech_body(
                self.rng, self.hooks, response_format=self.rng.choice(FORMATS)), JSON)
            if resp.status != 200:
                raise Unexplained(f"cancel mid-stream: status {resp.status}")
            want = self.rng.randrange(1, 3)
            async for _ in resp.pieces(2048):
                want -= 1
                if not want:
                    break
            resp.close()
        elif kind == "voice_upload":
            body, headers = self.voice_upload(f"soak-cut-{self.index}")
            _, writer = await send_request(self.t, "POST", "/v1/audio/voices", body, headers,
                                           send_body=self.rng.randrange(len(body) // 10, len(body) - 1))
            writer.close()
        elif kind == "ws_mid_stream":
            await self.ws(cancel=True)
        else:
            await self.wyoming(streaming=self.rng.random() < 0.5, cancel=True)
        return f"cancel:{kind}"

    async def bad(self) -> str:
        """Sends one bad request of a random kind and checks it gets the answer it should."""
        http: dict[str, Callable[[], Awaitable[Response]]] = {
            "bad_json": lambda: request(self.t, "POST", "/v1/audio/speech", b'{"input": "hi",', JSON),
            "unknown_voice": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "Hi there.", "voice": "nobody"}).encode(), JSON),
            "text_too_long": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "word " * 1200}).encode(), JSON),
            "bad_format": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "Hi.", "response_format": "aac"}).encode(), JSON),
            "bad_speed": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "Hi.", "speed": 9}).encode(), JSON),
            "empty_input": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": ""}).encode(), JSON),
            "wrong_type": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "Hi.", "speed": "fast"}).encode(), JSON),
            "bad_ref_audio": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "Hi.", "ref_audio": "not base64!"}).encode(), JSON),
            "bad_auth": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "Hi."}).encode(), JSON, auth="sk-wrong"),
            "no_auth": lambda: request(self.t, "POST", "/v1/audio/speech", json.dumps({"input": "Hi."}).encode(), JSON, auth=None),
            "content_type": lambda: request(self.t, "POST", "/v1/audio/speech", b"input=hi", {"Content-Type": "text/plain"}),
            "too_large": lambda: request(self.t, "POST", "/v1/audio/speech", b"", {"Content-Type": "application/json", "Content-Length": str(17 << 20)}),
            "unknown_route": lambda: request(self.t, "GET", "/v1/nope"),
            "wrong_method": lambda: request(self.t, "GET", "/v1/audio/speech"),
            "bad_voice_name": lambda: request(self.t, "POST", "/v1/audio/voices",
                                              json.dumps({"name": "../x", "ref_text": VOICE_TEXT,
                                                          "ref_audio": base64.b64encode(PROMPT_WAV.read_bytes()).decode()}).encode(), JSON),
            "delete_unknown_voice": lambda: request(self.t, "DELETE", "/v1/audio/voices/nobody"),
        }
        wanted = {"bad_json": 400, "unknown_voice": 404, "text_too_long": 400, "bad_format": 400, "bad_speed": 400,
                  "empty_input": 400, "wrong_type": 400, "bad_ref_audio": 400, "bad_auth": 401, "no_auth": 401,
                  "content_type": 415, "too_large": 413, "unknown_route": 404, "wrong_method": 405,
                  "bad_voice_name": 400, "delete_unknown_voice": 404}
        kinds = [*http, "ws_bad_frame", "ws_unknown_voice", "wyoming_bad_json", "wyoming_unknown_event",
                 "wyoming_chunk_outside_stream", "wyoming_unknown_voice", "wyoming_empty_text", "wyoming_header_too_big"]
        kind = self.rng.choice(kinds)
        if kind in http:
            resp = await http[kind]()
            try:
                body = await expect_status(resp, wanted[kind], kind)
            finally:
                resp.close()
            if not body.startswith(b'{"error"') and kind != "unknown_route" and kind != "wrong_method":
                raise Unexplained(f"{kind}: body {body[:120]!r}")
        elif kind.startswith("ws_"):
            await self.ws_bad(kind)
        else:
            await self.wyoming_bad(kind)
        return f"bad:{kind}"

    async def ws_bad(self, kind: str) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        url = f"ws://{self.t.host}:{self.t.port}/v1/audio/speech/stream"
        async with connect(url, additional_headers={"Authorization": f"Bearer {API_KEY}"}, open_timeout=60) as ws:
            await ws.send("not json" if kind == "ws_bad_frame" else json.dumps({"type": "session.config", "voice": "nobody"}))
            try:
                event = json.loads(await ws.recv())
            except ConnectionClosed as e:
                raise Unexplained(f"{kind}: closed ({e.rcvd}) without an error event") from None
            if event.get("type") != "error":
                raise Unexplained(f"{kind}: {event}")

    async def wyoming_bad(self, kind: str) -> None:
        from wyoming.event import Event, async_read_event, async_write_event

        reader, writer = await asyncio.open_connection(self.t.host, self.t.wyoming_port)
        try:
            if kind == "wyoming_bad_json":
                writer.write(b"{not json\n")
            elif kind == "wyoming_header_too_big":
                writer.write(b'{"type": "synthesize", "data": {"text": "' + b"a" * 70_000 + b'"}}\n')
            else:
                event = {"wyoming_unknown_event": Event("transcribe", {"language": "en"}),
                         "wyoming_chunk_outside_stream": Event("synthesize-chunk", {"text": "hello"}),
                         "wyoming_unknown_voice": Event("synthesize", {"text": "Hi there.", "voice": {"name": "nobody"}}),
                         "wyoming_empty_text": Event("synthesize", {"text": ""})}[kind]
                await async_write_event(event, writer)
            await writer.drain()
            answer = await async_read_event(reader)
            if answer is None or answer.type != "error":
                raise Unexplained(f"{kind}: {answer.type if answer else 'closed'} instead of an error event")
        finally:
            writer.close()

    async def run_one(self, op: str) -> None:
        self.stats.ops[op] += 1
        try:
            if op == "cancel":
                self.stats.asked[await asyncio.wait_for(self.cancel(), self.timeout_s)] += 1
            elif op == "bad":
                self.stats.asked[await asyncio.wait_for(self.bad(), self.timeout_s)] += 1
            else:
                call = {"http_whole": self.http_whole, "http_stream": self.http_stream,
                        "http_slow": lambda: self.http_stream(slow=True), "sse": self.sse, "ws": self.ws,
                        "wyoming_stream": lambda: self.wyoming(True), "wyoming_synth": lambda: self.wyoming(False),
                        "voices": self.voices}[op]
                await asyncio.wait_for(call(), self.timeout_s)
        except asyncio.TimeoutError:
            self.stats.error(f"{op}:timeout", f"no answer in {self.timeout_s} s")
        except Unexplained as e:
            self.stats.error(f"{op}:answer", str(e))
        except Exception as e:  # noqa: BLE001 - every other failure is one the soak did not ask for
            self.stats.error(f"{op}:{type(e).__name__}", repr(e))


# --- the server and what it uses -------------------------------------------------------------------

@dataclass
class Sample:
    t: float
    phase: str
    rss_kb: int
    fds: int
    threads: int
    in_flight: float
    queued: float
    connections: float
    ops: int
    unexplained: int
    latency_ms: dict[str, tuple[float, float]]


def proc_usage(pid: int) -> tuple[int, int, int]:
    """(RSS in KiB, open fds, threads) of the process."""
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return rss, len(os.listdir(f"/proc/{pid}/fd")), threads


async def metrics(t: Target) -> dict[str, float]:
    resp = await request(t, "GET", "/metrics", auth=None)
    text = (await resp.body()).decode()
    resp.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


async def at_rest(t: Target, pid: int, wait_s: float) -> tuple[bool, float, tuple[int, int, int]]:
    """Waits (bounded) until nothing runs or waits and no connection but the asking one is open,
    and the fd count is the same on two reads in a row; (reached, seconds, usage)."""
    start = time.monotonic()
    last: tuple[int, int, int] | None = None
    while time.monotonic() - start < wait_s:
        m = await metrics(t)
        quiet = (m.get("cosy_requests_in_flight", 1) == 0 and m.get("cosy_queue_depth", 1) == 0
                 and m.get("cosy_open_connections", 2) <= 1 and m.get("cosy_wyoming_connections", 1) == 0)
        await asyncio.sleep(0.5)
        usage = proc_usage(pid)
        if quiet and last is not None and usage[1] == last[1]:
            return True, time.monotonic() - start, usage
        last = usage if quiet else None
    return False, time.monotonic() - start, proc_usage(pid)


def windows(duration_s: float) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """(warm-up end, first window, last window) in seconds from the start of the load."""
    warm = duration_s / 6
    span = 600.0 if duration_s >= 1800 else (duration_s - warm) / 3
    return warm, (warm, warm + span), (duration_s - span, duration_s)


def window_mean(samples: list[Sample], span: tuple[float, float], key: Callable[[Sample], float]) -> float:
    values = [key(s) for s in samples if span[0] <= s.t <= span[1] and s.phase == "load"]
    return statistics.fmean(values) if values else float("nan")


def pct(first: float, last: float) -> float:
    return (last - first) / first * 100 if first else float("nan")


async def soak(args: argparse.Namespace, t: Target, pid: int, log: Path) -> tuple[dict[str, object], list[Sample]]:
    stats = Stats()
    hooks = Hooks(args.min_tokens, args.max_tokens)
    duration = args.minutes * 60
    warm, first_win, last_win = windows(duration)
    samples: list[Sample] = []
    gate = asyncio.Event()
    gate.set()
    stop = asyncio.Event()
    load_start = time.monotonic()
    phase = "load"
    names, weights = list(WEIGHTS), list(WEIGHTS.values())
    # The clients waiting at the closed gate; all of them = none has an operation under way.
    waiting = [0]
    all_waiting = asyncio.Event()

    async def client(index: int) -> None:
        c = Client(t, random.Random(f"{args.seed}-{index}"), stats, hooks, index, args.op_timeout_s)
        while not stop.is_set():
            if not gate.is_set():
                waiting[0] += 1
                if waiting[0] == args.clients:
                    all_waiting.set()
                await gate.wait()
                waiting[0] -= 1
            if stop.is_set():
                break
            await c.run_one(c.rng.choices(names, weights)[0])

    async def sampler() -> None:
        last_t = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(args.sample_s)
            now = time.monotonic()
            try:
                m = await metrics(t)
                rss, fds, threads = proc_usage(pid)
            except (OSError, AttributeError) as e:
                stats.error("monitor", repr(e))
                continue
            lat = {}
            for door in sorted({*WEIGHTS, "voice_add"} - {"cancel", "bad", "voices"}):
                values = [v for (at, v) in stats.latencies.get(door, []) if last_t < at <= now]
                lat[door] = (percentile(values, 0.5) * 1000, percentile(values, 0.99) * 1000)
            samples.append(Sample(now - load_start, phase, rss, fds, threads, m.get("cosy_requests_in_flight", -1),
                                  m.get("cosy_queue_depth", -1), m.get("cosy_open_connections", -1),
                                  sum(stats.ops.values()), sum(stats.unexplained.values()), lat))
            last_t = now
            print(f"soak: {now - load_start:6.0f} s  rss {rss / 1024:6.1f} MiB  fds {fds:4d}  threads {threads:3d}  "
                  f"in-flight {m.get('cosy_requests_in_flight', -1):.0f}  ops {sum(stats.ops.values())}  "
                  f"unexplained {sum(stats.unexplained.values())}", flush=True)

    tasks = [asyncio.create_task(client(i)) for i in range(args.clients)]
    sampling = asyncio.create_task(sampler())
    # Warm-up, then a pause at rest (fds counted with nothing open), then the load again.
    await asyncio.sleep(warm)
    gate.clear()
    phase = "rest"
    await all_waiting.wait()  # each operation is bounded by --op-timeout-s
    rest_warm = await at_rest(t, pid, args.settle_s)
    phase = "load"
    gate.set()
    await asyncio.sleep(max(0.0, duration - (time.monotonic() - load_start)))
    stop.set()
    phase = "drain"
    drain_start = time.monotonic()
    await asyncio.gather(*tasks)
    sampling.cancel()
    drained_clients_s = time.monotonic() - drain_start
    rest_end = await at_rest(t, pid, args.settle_s)
    # Still serving: one good request after everything.
    final = Client(t, random.Random(args.seed), stats, hooks, -1, args.op_timeout_s)
    await final.run_one("http_whole")

    panics = [line for line in log.read_text(errors="replace").splitlines() if "panicked" in line]
    for line in panics:
        stats.error("server:panic", line)

    load = [s for s in samples if s.phase == "load"]
    rss_first, rss_last = window_mean(load, first_win, lambda s: s.rss_kb), window_mean(load, last_win, lambda s: s.rss_kb)
    fds_first, fds_last = window_mean(load, first_win, lambda s: s.fds), window_mean(load, last_win, lambda s: s.fds)
    thr_first, thr_last = window_mean(load, first_win, lambda s: s.threads), window_mean(load, last_win, lambda s: s.threads)
    doors = {}
    for door, values in sorted(stats.latencies.items()):
        v = [x for _, x in values]
        doors[door] = {"count": len(v), "p50_ms": round(percentile(v, 0.5) * 1000, 1), "p99_ms": round(percentile(v, 0.99) * 1000, 1)}
    checks = [
        {"check": "RSS flat (mean of last window vs first, %)", "value": round(pct(rss_first, rss_last), 2),
         "bound": args.rss_bound_pct, "pass": abs(pct(rss_first, rss_last)) <= args.rss_bound_pct},
        {"check": "fds flat under load (mean of last window vs first, %)", "value": round(pct(fds_first, fds_last), 2),
         "bound": args.fd_bound_pct, "pass": abs(pct(fds_first, fds_last)) <= args.fd_bound_pct},
        {"check": "fds at rest: after the load minus after warm-up", "value": rest_end[2][1] - rest_warm[2][1],
         "bound": 0, "pass": rest_warm[0] and rest_end[0] and rest_end[2][1] == rest_warm[2][1]},
        {"check": f"in-flight and queue back to 0, no connection left (s, within {args.settle_s:.0f})",
         "value": round(rest_end[1], 1), "bound": args.settle_s, "pass": rest_end[0]},
        {"check": "unexplained errors", "value": sum(stats.unexplained.values()), "bound": 0,
         "pass": sum(stats.unexplained.values()) == 0},
    ]
    summary: dict[str, object] = {
        "model": str(args.model), "binary": str(args.cosy), "minutes": args.minutes, "clients": args.clients,
        "seed": args.seed, "min_tokens": args.min_tokens, "max_tokens": args.max_tokens, "sample_s": args.sample_s,
        "load_average_at_end": Path("/proc/loadavg").read_text().split()[:3],
        "cpus": os.cpu_count(),
        "windows_s": {"warm_up_end": round(warm, 1), "first": [round(x, 1) for x in first_win], "last": [round(x, 1) for x in last_win]},
        "rss_mib": {"first": round(rss_first / 1024, 2), "last": round(rss_last / 1024, 2), "change_pct": round(pct(rss_first, rss_last), 2)},
        "fds": {"first": round(fds_first, 2), "last": round(fds_last, 2), "change_pct": round(pct(fds_first, fds_last), 2),
                "at_rest_after_warm_up": rest_warm[2][1], "at_rest_after_load": rest_end[2][1]},
        "threads": {"first": round(thr_first, 2), "last": round(thr_last, 2),
                    "at_rest_after_warm_up": rest_warm[2][2], "at_rest_after_load": rest_end[2][2]},
        "rss_mib_at_rest": {"after_warm_up": round(rest_warm[2][0] / 1024, 2), "after_load": round(rest_end[2][0] / 1024, 2)},
        "clients_done_after_stop_s": round(drained_clients_s, 1),
        "operations": dict(sorted(stats.ops.items())), "operations_total": sum(stats.ops.values()),
        "latency_per_door": doors,
        "errors_asked_for": dict(sorted(stats.asked.items())), "errors_unexplained": dict(sorted(stats.unexplained.items())),
        "unexplained_examples": stats.unexplained_examples,
        "checks": checks, "pass": all(c["pass"] for c in checks),
    }
    return summary, samples


def write_outputs(out: Path, summary: dict[str, object], samples: list[Sample], plot: bool) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1) + "\n")
    doors = sorted(samples[0].latency_ms) if samples else []
    with out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "phase", "rss_kib", "fds", "threads", "in_flight", "queued", "connections", "ops", "unexplained",
                    *[f"{d}_{q}_ms" for d in doors for q in ("p50", "p99")]])
        for s in samples:
            w.writerow([f"{s.t:.1f}", s.phase, s.rss_kb, s.fds, s.threads, f"{s.in_flight:.0f}", f"{s.queued:.0f}",
                        f"{s.connections:.0f}", s.ops, s.unexplained,
                        *["" if v != v else f"{v:.0f}" for d in doors for v in s.latency_ms[d]]])
    md = [f"# Soak: {summary['model']}, {summary['minutes']} min, {summary['clients']} clients (seed {summary['seed']})", "",
          f"Binary `{summary['binary']}`; {summary['cpus']} CPUs, load average at the end {' '.join(summary['load_average_at_end'])}; "  # type: ignore[arg-type]
          f"{summary['operations_total']} operations. Windows (s from the start of the load): {summary['windows_s']}.", "",
          "| check | value | bound | pass |", "|---|---|---|---|"]
    md += [f"| {c['check']} | {c['value']} | {c['bound']} | {'yes' if c['pass'] else '**no**'} |" for c in summary["checks"]]  # type: ignore[attr-defined]
    md += ["", f"RSS MiB (first / last window): {summary['rss_mib']}; at rest: {summary['rss_mib_at_rest']}",
           f"fds: {summary['fds']}", f"threads: {summary['threads']}", "",
           "| door | count | p50 ms | p99 ms |", "|---|---|---|---|"]
    md += [f"| {d} | {v['count']} | {v['p50_ms']} | {v['p99_ms']} |" for d, v in summary["latency_per_door"].items()]  # type: ignore[attr-defined]
    md += ["", "Latency: time to the first audio byte for streamed doors (http_stream, http_slow, ws, wyoming_*; sse from "
           "its done event's first_audio_s), the whole answer for http_whole and voice_add.", "",
           f"Errors asked for: {summary['errors_asked_for']}", "", f"Errors unexplained: {summary['errors_unexplained']}"]
    md += [f"- {e}" for e in summary["unexplained_examples"]]  # type: ignore[attr-defined]
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    if not plot or not samples:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t / 60 for s in samples]
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    axes[0].plot(t, [s.rss_kb / 1024 for s in samples]); axes[0].set_ylabel("RSS MiB")
    axes[1].plot(t, [s.fds for s in samples], label="fds"); axes[1].plot(t, [s.threads for s in samples], label="threads")
    axes[1].legend(loc="upper left")
    axes[2].plot(t, [s.in_flight for s in samples], label="in flight"); axes[2].plot(t, [s.queued for s in samples], label="queued")
    axes[2].legend(loc="upper left")
    for d in doors:
        axes[3].plot(t, [s.latency_ms[d][1] for s in samples], label=f"{d} p99", marker=".", linestyle="none")
    axes[3].set_ylabel("ms"); axes[3].set_yscale("log"); axes[3].legend(loc="upper left", fontsize=7, ncol=3)
    axes[3].set_xlabel("minutes")
    w = summary["windows_s"]
    for ax in axes:
        ax.axvspan(w["first"][0] / 60, w["first"][1] / 60, color="green", alpha=0.08)  # type: ignore[index]
        ax.axvspan(w["last"][0] / 60, w["last"][1] / 60, color="blue", alpha=0.08)  # type: ignore[index]
    fig.suptitle(f"cosy serve soak: {Path(str(summary['model'])).name}, {summary['minutes']} min, {summary['clients']} clients")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=80)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=REPO / "tests/fixtures/tiny")
    p.add_argument("--cosy", type=Path, default=None, help="the binary (default target/release/cosy, else target/debug/cosy)")
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--clients", type=int, default=6, help="concurrent clients (bounded: each runs one operation at a time)")
    p.add_argument("--seed", type=int, default=30)
    p.add_argument("--min-tokens", type=int, default=None,
                   help="speech tokens forced per sentence (debug.test_hooks); default 60 for the bundled tiny model, whose "
                        "random weights stop after a token or two, else 0 (the model decides)")
    p.add_argument("--max-tokens", type=int, default=0,
                   help="speech tokens at most per sentence or streamed segment (debug.test_hooks): a full-size random "
                        "model never stops by itself")
    p.add_argument("--op-timeout-s", type=float, default=180.0,
                   help="bound of one operation: past it, an unexplained error")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--settle-s", type=float, default=60.0, help="bounded wait for the server to be at rest")
    p.add_argument("--rss-bound-pct", type=float, default=5.0)
    p.add_argument("--fd-bound-pct", type=float, default=5.0)
    p.add_argument("--out", type=Path, default=None, help="output path without suffix (default bench/results/soak-MODEL-MINm)")
    p.add_argument("server_args", nargs="*", help="after --: more arguments for cosy (e.g. --set runtime.precision=int8)")
    args = p.parse_args()
    # Stopped early (Ctrl-C, even when started in the background, or SIGTERM): the server is stopped too.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        import matplotlib  # noqa: F401
        plot = True
    except ImportError:
        if in_ci():
            print("soak: CI=true and matplotlib is missing (bench/soak.sh or scripts/setup.sh --python installs it)", file=sys.stderr)
            return 1
        print("soak: matplotlib is missing: no plot", file=sys.stderr)
        plot = False
    if args.cosy is None:
        args.cosy = next((b for b in (REPO / "target/release/cosy", REPO / "target/debug/cosy") if b.is_file()), None)
        if args.cosy is None:
            print("soak: no built cosy binary (cargo build)", file=sys.stderr)
            return 1
    args.cosy, args.model = args.cosy.resolve(), args.model.resolve()
    tiny = args.model == (REPO / "tests/fixtures/tiny").resolve()
    if args.min_tokens is None:
        args.min_tokens = 60 if tiny else 0
    out = args.out or REPO / f"bench/results/soak-{args.model.resolve().name}-{args.minutes:g}m"

    with tempfile.TemporaryDirectory(prefix="cosy-soak-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith("COSY_")}
        env.update(HOME=str(work), COSY_GRAPH_CACHE=str(work / "gc"), XDG_RUNTIME_DIR=str(work / "run"), COSY_SERVER="off")
        base = [str(args.cosy), "--model", str(args.model), "--set", f"voices.dir={work / 'voices'}", *args.server_args]
        subprocess.run([*base, "-q", "voice", "add", "me", "--wav", str(PROMPT_WAV), "--text", VOICE_TEXT, "--default"],
                       cwd=work, env=env, check=True, stdout=subprocess.DEVNULL)
        settings = ["--set", f"server.api_key={API_KEY}", "--set", "server.socket=off"]
        if Hooks(args.min_tokens, args.max_tokens).enabled:
            settings += ["--set", "debug.test_hooks=true"]
        log = work / "server.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen([*base, *settings, "serve", "--bind", "127.0.0.1:0", "--wyoming", "127.0.0.1:0"],
                                    cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
        try:
            # Bounded: a full-size model on a loaded 2-core machine takes minutes to load and warm up.
            deadline = time.monotonic() + 900
            while not (m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))):
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(log.read_text(errors="replace"), file=sys.stderr)
                    return 1
                time.sleep(0.1)
            wy = re.search(r"wyoming on tcp://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            assert wy, log.read_text(errors="replace")
            t = Target("127.0.0.1", int(m.group(1)), int(wy.group(1)))
            while True:
                try:
                    if asyncio.run(request(t, "GET", "/ready", auth=None)).status == 200:
                        break
                except OSError:
                    pass
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(log.read_text(errors="replace"), file=sys.stderr)
                    return 1
                time.sleep(0.2)
            print(f"soak: {args.cosy} on {t} (pid {proc.pid}), {args.minutes:g} min, {args.clients} clients, "
                  f"load average {Path('/proc/loadavg').read_text().split()[:3]}", flush=True)
            summary, samples = asyncio.run(soak(args, t, proc.pid, log))
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                rc = proc.wait()
        exit_check = {"check": "SIGTERM ends the server with status 0", "value": rc, "bound": 0, "pass": rc == 0}
        summary["checks"].append(exit_check)  # type: ignore[attr-defined]
        summary["pass"] = summary["pass"] and rc == 0
        if not summary["pass"]:
            (out.parent).mkdir(parents=True, exist_ok=True)
            out.with_suffix(".log").write_text(log.read_text(errors="replace")[-200_000:])
    write_outputs(out, summary, samples, plot)
    print(out.with_suffix(".md").read_text())
    print(f"soak: {'pass' if summary['pass'] else 'FAIL'}: {out}.{{json,md,csv,png}}")
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

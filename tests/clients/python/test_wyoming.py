"""The Wyoming server of `cosy serve` (docs/wyoming.md) with Home Assistant's own client library, the
`wyoming` package (pinned in tests/clients/requirements.txt): `describe`, `synthesize`, the streaming
events, bad input, a client that goes away, and the engine's one admission shared with HTTP.

Audio equality is exact: the Wyoming server, `cosy file` and the WebSocket run the same binary on
the same machine in the same test, with the same model, voice and seed (the engine's batching does
not change a request's numbers: tests/pipeline/engine_concurrency.rs; tests/serve/api.rs holds the
HTTP API to `cosy file` byte for byte the same way). Every read has a timeout; nothing is timed:
"first audio before synthesize-stop" is the order of events (stop is sent only after an audio chunk
came back)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from conftest import skip_or_fail
from harness import PROMPT_WAV, VOICE_TEXT, Server, Work, serve

try:
    import websockets.sync.client as ws_client
    from wyoming.audio import AudioChunk, AudioStart
    from wyoming.client import AsyncTcpClient
    from wyoming.error import Error
    from wyoming.event import Event, async_read_event, async_write_event
    from wyoming.info import Describe, Info
    from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice
except ImportError:  # the pinned requirements install them; without them the tests skip (fail under CI)
    ws_client = None  # type: ignore[assignment]

READ_TIMEOUT_S = 60.0
# DEFAULT_TEXT gives 2.76 s of audio at the default seed with the bundled tiny model (random weights:
# other texts may stop after a token or two).
DEFAULT_TEXT = "Hello, this is cosy speaking."
# Text as a language model writes it, with a number and a unit (normalised as settled sentences).
PIECES = ["Hello, this ", "is cosy ", "speaking. The ", "kitchen is at ", "21 degrees, ", "and the lights ", "are on."]
LIMIT_CHARS = 300


@pytest.fixture(scope="module", autouse=True)
def _clients() -> None:
    if ws_client is None:
        skip_or_fail("the wyoming and websockets packages are not installed (scripts/setup.sh --python installs tests/clients/requirements.txt)")


@pytest.fixture(scope="module")
def server(work: Work) -> Iterator[Server]:
    with serve(work, "wyoming", "--set", "debug.test_hooks=true", "--set", "wyoming.max_header_bytes=4096",
               "--set", f"limits.max_text_chars={LIMIT_CHARS}", wyoming=True) as s:
        yield s


@asynccontextmanager
async def connect(server: Server) -> AsyncIterator[AsyncTcpClient]:
    assert server.wyoming_port is not None
    async with AsyncTcpClient("127.0.0.1", server.wyoming_port, connect_timeout=10.0, read_timeout=READ_TIMEOUT_S) as client:
        yield client


async def read(client: AsyncTcpClient) -> Event:
    event = await client.read_event()
    assert event is not None, "the server closed the connection"
    return event


async def audio_until(client: AsyncTcpClient, last: str) -> tuple[list[Event], bytes]:
    """Events until one of type `last` (audio-stop, synthesize-stopped), and the PCM of their chunks."""
    events: list[Event] = []
    while True:
        event = await read(client)
        assert not Error.is_type(event.type), f"error event: {event.data}"
        events.append(event)
        if event.type == last:
            return events, b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))


def check_format(events: list[Event]) -> None:
    """audio-start first with 24 kHz s16le mono, every chunk in it, one audio-stop."""
    assert AudioStart.is_type(events[0].type), [e.type for e in events]
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (24_000, 2, 1)
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert all((c.rate, c.width, c.channels) == (24_000, 2, 1) for c in chunks)
    assert [e.type for e in events].count("audio-stop") == 1


def metrics(server: Server) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
        return r.read().decode()


def metric(server: Server, line_start: str) -> float:
    m = re.search(rf"^{re.escape(line_start)} (\S+)$", metrics(server), re.M)
    return float(m.group(1)) if m else 0.0


def wait_for_metric(server: Server, name: str, want: float, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while metric(server, name) != want:
        assert time.monotonic() < deadline, f"{name} is {metric(server, name)}, not {want}, after {timeout_s} s"
        time.sleep(0.05)


# --- describe, synthesize -------------------------------------------------------------------------

def test_describe_lists_the_saved_voices(server: Server, work: Work) -> None:
    # Saved after the server started: describe reads the voices folder each time.
    work.cosy("voice", "add", "second", "--wav", str(PROMPT_WAV), "--text", VOICE_TEXT)

    async def run() -> Info:
        async with connect(server) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await read(client))

    info = asyncio.run(run())
    assert len(info.tts) == 1
    program = info.tts[0]
    assert program.name == "cosy" and program.installed and program.supports_synthesize_streaming
    assert program.version and program.attribution.name
    assert sorted(v.name for v in program.voices) == ["me", "second"]
    me = next(v for v in program.voices if v.name == "me")
    assert me.installed and "default" in (me.description or "")
    assert {"en", "zh"} <= set(me.languages)


def test_synthesize_gives_what_cosy_file_stream_writes_twice_on_one_connection(server: Server, work: Work) -> None:
    expected = work.cli_audio("file-stream.pcm", DEFAULT_TEXT, "--voice", "me", "--stream", "--format", "pcm")

    async def run() -> list[tuple[list[Event], bytes]]:
        async with connect(server) as client:
            results = []
            # The voice by name, then (the same connection) the default voice: Home Assistant's default.
            for voice in (SynthesizeVoice(name="me"), None):
                await client.write_event(Synthesize(text=DEFAULT_TEXT, voice=voice).event())
                results.append(await audio_until(client, "audio-stop"))
            return results

    for events, pcm in asyncio.run(run()):
        check_format(events)
        assert pcm == expected, f"{len(pcm)} bytes from Wyoming, {len(expected)} from cosy file --stream"
        # The streaming schedule: the audio came in more than one chunk, as it was made.
        assert sum(AudioChunk.is_type(e.type) for e in events) >= 2
    assert metric(server, 'cosy_wyoming_requests_total{request="synthesize",outcome="ok"}') >= 2


# --- streaming ------------------------------------------------------------------------------------

def websocket_audio(server: Server) -> bytes:
    """The WebSocket's text streaming of PIECES (normalised, as Wyoming's default), sent the same way:
    the pieces, then (after the first audio) the end of the input."""
    url = f"ws://127.0.0.1:{server.port}/v1/audio/speech/stream"
    pcm = b""
    with ws_client.connect(url, open_timeout=30, close_timeout=10, max_size=None) as ws:
        ws.send('{"type": "session.config", "voice": "me", "normalize": true}')
        for piece in PIECES:
            ws.send(json.dumps({"type": "input.text", "text": piece}))
        done_sent = False
        while True:
            message = ws.recv(timeout=READ_TIMEOUT_S)
            if isinstance(message, bytes):
                pcm += message
                if not done_sent:
                    ws.send('{"type": "input.done"}')
                    done_sent = True
                continue
            assert '"error"' not in message, message
            if '"session.done"' in message:
                return pcm


def test_streamed_text_gives_the_websockets_audio_and_audio_before_stop(server: Server) -> None:
    async def run() -> tuple[list[Event], list[Event], bytes]:
        async with connect(server) as client:
            voice = SynthesizeVoice(name="me")
            await client.write_event(SynthesizeStart(voice=voice).event())
            for piece in PIECES:
                await client.write_event(SynthesizeChunk(text=piece).event())
            # Read until the first audio chunk: synthesize-stop has not been sent yet.
            before: list[Event] = []
            while not before or not AudioChunk.is_type(before[-1].type):
                event = await read(client)
                assert not Error.is_type(event.type), event.data
                before.append(event)
            # What Home Assistant sends next: the whole text again (for servers that cannot stream;
            # it must not be spoken twice), then the end of the stream.
            await client.write_event(Synthesize(text="".join(PIECES), voice=voice).event())
            await client.write_event(SynthesizeStop().event())
            after, _ = await audio_until(client, "synthesize-stopped")
            events = before + after
            pcm = b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))
            # A second stream on the same connection.
            await client.write_event(SynthesizeStart(voice=voice).event())
            await client.write_event(SynthesizeChunk(text=DEFAULT_TEXT).event())
            await client.write_event(SynthesizeStop().event())
            second, second_pcm = await audio_until(client, "synthesize-stopped")
            assert second_pcm, "the second stream gave audio"
            return events, second, pcm

    events, second, pcm = asyncio.run(run())
    for stream in (events, second):
        kinds = [e.type for e in stream]
        assert kinds[-2:] == ["audio-stop", "synthesize-stopped"], kinds
        check_format(stream)
    assert pcm == websocket_audio(server), "Wyoming streaming differs from the WebSocket's text streaming"


# --- bad input --------------------------------------------------------------------------------------

def raw(obj: str) -> bytes:
    return obj.encode() + b"\n"


async def exchange(server: Server, wire: list[bytes | Event]) -> tuple[list[Event], bool]:
    """Writes `wire` (raw bytes or events) on a new connection and reads until the first error event
    or the end of the connection; (events read, whether the server closed it)."""
    assert server.wyoming_port is not None
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.wyoming_port), 10)
    try:
        for item in wire:
            if isinstance(item, Event):
                await async_write_event(item, writer)
            else:
                writer.write(item)
                await writer.drain()
        events: list[Event] = []
        while True:
            event = await asyncio.wait_for(async_read_event(reader), READ_TIMEOUT_S)
            if event is None:
                return events, True
            events.append(event)
            if Error.is_type(event.type):
                return events, False
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


def test_bad_input_gets_an_error_and_the_server_keeps_serving(server: Server) -> None:
    me = {"voice": {"name": "me"}}
    cases: list[tuple[str, list[bytes | Event], str]] = [
        ("unknown voice", [Synthesize(text=DEFAULT_TEXT, voice=SynthesizeVoice(name="nobody")).event()], "nobody"),
        ("empty text", [Synthesize(text="").event()], "text"),
        ("only punctuation", [Synthesize(text=" ... !").event()], "text"),
        ("text over the limit", [Synthesize(text="word " * LIMIT_CHARS).event()], "limits.max_text_chars"),
        ("streamed text over the limit", [Event("synthesize-start", me), *[SynthesizeChunk(text="word " * 20).event()] * 5],
         "limits.max_text_chars"),
        ("a stream with no text", [Event("synthesize-start", me), SynthesizeStop().event()], ""),
        ("text not a string", [Event("synthesize", {"text": 42})], "string"),
        ("no text", [Event("synthesize", {})], "text"),
        ("voice not an object", [Event("synthesize", {"text": DEFAULT_TEXT, "voice": "me"})], "voice"),
        ("ssml", [Event("synthesize", {"text": DEFAULT_TEXT, "text_format": "ssml"})], "ssml"),
        ("malformed JSON", [raw("{not json")], "JSON"),
        ("header not an object", [raw("[1, 2]")], "object"),
        ("header without a type", [raw('{"data": {"text": "hi"}}')], "type"),
        ("header over wyoming.max_header_bytes", [raw('{"type": "synthesize", "data": {"text": "' + "a" * 5000 + '"}}')],
         "max_header_bytes"),
        ("data over wyoming.max_payload_bytes", [raw('{"type": "synthesize", "data_length": 1000000000}')], "max_payload_bytes"),
        ("data not JSON", [raw('{"type": "synthesize", "data_length": 5}') + b"hello"], "JSON"),
        ("unknown event", [Event("transcribe", {"language": "en"})], "transcribe"),
        ("a chunk outside a stream", [SynthesizeChunk(text="hello").event()], "synthesize-start"),
        ("a second synthesize-start", [Event("synthesize-start", me), Event("synthesize-start", me)], "synthesize-stop"),
        ("bad test hooks", [Event("synthesize", {"text": DEFAULT_TEXT, "cosy_test": {"nonsense": 1}})], "cosy_test"),
    ]
    assert len(cases) >= 10

    async def run() -> None:
        for name, wire, needle in cases:
            events, closed = await exchange(server, wire)
            errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
            assert errors, f"{name}: no error event (closed: {closed}; events: {[e.type for e in events]})"
            assert needle in errors[0].text, f"{name}: {errors[0].text!r} does not name {needle!r}"
            assert "\n" not in errors[0].text and errors[0].code, f"{name}: {errors[0]}"
        # An unknown event leaves its connection open: the next request on it is served.
        async with connect(server) as client:
            await client.write_event(Event("transcribe", {}))
            assert Error.is_type((await read(client)).type)
            await client.write_event(Synthesize(text=DEFAULT_TEXT).event())
            events, pcm = await audio_until(client, "audio-stop")
            assert pcm

    asyncio.run(run())
    wait_for_metric(server, "cosy_requests_in_flight", 0)


def test_a_client_gone_mid_stream_frees_its_slot(server: Server) -> None:
    cancelled = metric(server, "cosy_requests_cancelled_total")

    async def run() -> None:
        async with connect(server) as client:
            start = SynthesizeStart(voice=SynthesizeVoice(name="me")).event()
            # Held after its first audio until the client goes (debug.test_hooks): nothing else ends it.
            start.data["cosy_test"] = {"hold_after_first_audio": True}
            await client.write_event(start)
            for piece in PIECES:
                await client.write_event(SynthesizeChunk(text=piece).event())
            while not AudioChunk.is_type((await read(client)).type):
                pass
            assert metric(server, "cosy_requests_in_flight") == 1
        # The connection is closed here, mid-stream.

    asyncio.run(run())
    wait_for_metric(server, "cosy_requests_in_flight", 0)
    assert metric(server, "cosy_requests_cancelled_total") > cancelled
    assert metric(server, 'cosy_wyoming_requests_total{request="stream",outcome="cancelled"}') >= 1


# --- one engine, one admission ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def one_slot(work: Work) -> Iterator[Server]:
    with serve(work, "wyoming-one-slot", "--set", "debug.test_hooks=true", "--set", "engine.max_in_flight=1",
               "--set", "engine.max_queue=0", "--set", "wyoming.max_connections=2", wyoming=True) as s:
        yield s


def held_http(server: Server) -> Any:
    """A streamed HTTP speech request held after its first audio (its slot taken), first bytes read."""
    body = ('{"input": "%s", "voice": "me", "response_format": "pcm", "cosy_test": {"hold_after_first_audio": true}}'
            % DEFAULT_TEXT).encode()
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}/v1/audio/speech", data=body,
                                     headers={"Content-Type": "application/json"})
    response = opener.open(request, timeout=READ_TIMEOUT_S)
    assert response.status == 200 and response.read(2)
    return response


def test_http_and_wyoming_share_the_engines_admission(one_slot: Server) -> None:
    # HTTP holds the one slot: Wyoming is told the server is busy.
    response = held_http(one_slot)
    events, _ = asyncio.run(exchange(one_slot, [Synthesize(text=DEFAULT_TEXT).event()]))
    assert events and Error.is_type(events[-1].type) and Error.from_event(events[-1]).code == "server_busy", events
    response.close()
    wait_for_metric(one_slot, "cosy_requests_in_flight", 0)

    # Wyoming holds it: HTTP gets 429.
    async def held_wyoming() -> None:
        async with connect(one_slot) as client:
            event = Synthesize(text=DEFAULT_TEXT).event()
            event.data["cosy_test"] = {"hold_after_first_audio": True}
            await client.write_event(event)
            while not AudioChunk.is_type((await read(client)).type):
                pass
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            request = urllib.request.Request(f"http://127.0.0.1:{one_slot.port}/v1/audio/speech",
                                             data=('{"input": "%s", "response_format": "pcm"}' % DEFAULT_TEXT).encode(),
                                             headers={"Content-Type": "application/json"})
            with pytest.raises(urllib.error.HTTPError) as refused:
                opener.open(request, timeout=READ_TIMEOUT_S)
            assert refused.value.code == 429

    asyncio.run(held_wyoming())
    wait_for_metric(one_slot, "cosy_requests_in_flight", 0)
    # Both work again once the slot is free.
    async def good() -> bytes:
        async with connect(one_slot) as client:
            await client.write_event(Synthesize(text=DEFAULT_TEXT).event())
            return (await audio_until(client, "audio-stop"))[1]

    assert asyncio.run(good())


def test_connections_beyond_wyoming_max_connections_are_told_and_closed(one_slot: Server) -> None:
    wait_for_metric(one_slot, "cosy_wyoming_connections", 0)

    async def run() -> None:
        async with connect(one_slot), connect(one_slot):
            await asyncio.to_thread(wait_for_metric, one_slot, "cosy_wyoming_connections", 2)
            async with connect(one_slot) as third:
                refusal = await read(third)
                assert Error.is_type(refusal.type) and Error.from_event(refusal).code == "too_many_connections", refusal
                assert "wyoming.max_connections" in Error.from_event(refusal).text
                assert await third.read_event() is None, "closed after the refusal"
        await asyncio.to_thread(wait_for_metric, one_slot, "cosy_wyoming_connections", 0)
        async with connect(one_slot) as client:
            await client.write_event(Describe().event())
            assert Info.is_type((await read(client)).type)

    asyncio.run(run())


def test_a_silent_connection_and_a_stream_without_text_end_at_the_idle_timeout(work: Work) -> None:
    with serve(work, "wyoming-idle", "--set", "wyoming.idle_timeout_s=1", "--set", "server.warmup=false", wyoming=True) as s:
        async def run() -> list[tuple[list[Event], bool]]:
            silent = await exchange(s, [])
            # A stream whose text never comes: its speech slot is freed too.
            waiting = await exchange(s, [SynthesizeStart(voice=SynthesizeVoice(name="me")).event()])
            return [silent, waiting]

        for events, _ in asyncio.run(run()):
            assert events and Error.from_event(events[-1]).code == "idle_timeout", events
            assert "wyoming.idle_timeout_s" in Error.from_event(events[-1]).text
        wait_for_metric(s, "cosy_requests_in_flight", 0)

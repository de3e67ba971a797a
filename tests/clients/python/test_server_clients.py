"""Real clients against `cosy serve`, each with its own defaults, as an application would use them:
the official openai Python SDK and Node SDK (no `response_format`, OpenAI voice names, plain
`create`), ffmpeg decoding every format the server sends, and headless Chromium loading a page from
another loopback origin that calls the API with fetch (CORS) and the WebSocket.

Random weights: DEFAULT_TEXT gives 2.76 s of audio at the server's default seed with the bundled
tiny model (other texts may stop after a token or two)."""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, skip_or_fail
from harness import API_KEY, SAMPLE_RATE, Server, Work, openai, serve

DEFAULT_TEXT = "Hello, this is cosy speaking."
NODE_DIR = REPO / "tests/clients/node"
# Every format the server sends, with ffmpeg's input options for it (pcm has no container). aac is
# refused with a 400 that names these (docs/server.md: no AAC encoder with an open licence).
FORMATS: dict[str, list[str]] = {
    "mp3": [], "opus": [], "flac": [], "wav": [],
    "pcm": ["-f", "s16le", "-ar", str(SAMPLE_RATE), "-ac", "1"],
}
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/opus", "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"{name} is not installed (scripts/setup.sh --python installs it)")
    return str(path)


def ffmpeg_seconds(body: bytes, fmt: str) -> float:
    """Decodes `body` with ffmpeg (errors fail the test) and returns its length in seconds."""
    st = subprocess.run([_tool("ffmpeg"), "-nostdin", "-v", "error", *FORMATS[fmt], "-i", "pipe:0",
                         "-f", "s16le", "-ac", "1", "-ar", str(SAMPLE_RATE), "pipe:1"],
                        input=body, capture_output=True, timeout=120)
    assert st.returncode == 0 and not st.stderr.strip(), f"ffmpeg could not decode the {fmt} body: {st.stderr.decode(errors='replace')}"
    return len(st.stdout) / 2 / SAMPLE_RATE


@pytest.fixture(scope="module")
def cli_seconds(work: Work) -> float:
    """How long the same text and voice are from `cosy file` (seed and schedule as the server's)."""
    return ffmpeg_seconds(work.cli_audio("defaults.wav", DEFAULT_TEXT, "--voice", "me"), "wav")


# --- the openai Python SDK with its defaults -------------------------------------------------------

def test_python_sdk_defaults_get_mp3(auth_server: Server, cli_seconds: float) -> None:
    """`create(model="tts-1", voice="alloy", input=...)`, nothing else: what every tutorial does."""
    with auth_server.client(API_KEY) as client:
        r = client.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input=DEFAULT_TEXT)
        assert r.headers["content-type"].startswith("audio/mpeg")
        assert r.headers.get("x-cosy-voice", "").startswith("me")
        body = r.content
    # mp3 frames pad the end (and the encoder's delay the start): a frame or two either side.
    assert abs(ffmpeg_seconds(body, "mp3") - cli_seconds) < 0.15


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_python_sdk_every_format_decodes(auth_server: Server, cli_seconds: float, fmt: str) -> None:
    with auth_server.client(API_KEY) as client:
        with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="coral", input=DEFAULT_TEXT,
                                                                response_format=fmt) as r:  # type: ignore[arg-type]
            assert r.status_code == 200
            assert r.headers["content-type"].startswith(CONTENT_TYPES[fmt])
            body = b"".join(r.iter_bytes())
    assert abs(ffmpeg_seconds(body, fmt) - cli_seconds) < 0.15


def test_python_sdk_aac_is_refused_naming_what_is_served(auth_server: Server) -> None:
    with auth_server.client(API_KEY) as client, pytest.raises(openai.BadRequestError) as refused:
        client.audio.speech.create(model="tts-1", voice="alloy", input=DEFAULT_TEXT, response_format="aac")
    message = str(refused.value)
    assert all(fmt in message for fmt in FORMATS), message


# --- the openai Node SDK with its defaults ---------------------------------------------------------

def _node(server: Server, work: Work, plan: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not (NODE_DIR / "node_modules/openai/package.json").is_file():
        skip_or_fail("the openai Node SDK is not installed (scripts/setup.sh --python runs npm ci in tests/clients/node)")
    plan_path = work.root / "node-plan.json"
    plan_path.write_text(json.dumps(plan))
    st = subprocess.run([_tool("node"), str(NODE_DIR / "speech.mjs"), server.base_url, API_KEY, str(plan_path)],
                        cwd=NODE_DIR, capture_output=True, text=True, timeout=300)
    assert st.returncode == 0, st.stderr
    return [json.loads(line) for line in st.stdout.splitlines() if line.strip()]


def test_node_sdk_defaults_and_formats(auth_server: Server, work: Work, cli_seconds: float) -> None:
    plan = [{"name": "defaults", "params": {"model": "tts-1", "voice": "alloy", "input": DEFAULT_TEXT},
             "out": str(work.root / "node-defaults.bin")}]
    plan += [{"name": fmt, "params": {"model": "tts-1", "voice": "nova", "input": DEFAULT_TEXT, "response_format": fmt},
              "out": str(work.root / f"node.{fmt}")} for fmt in FORMATS]
    results = {r["name"]: r for r in _node(auth_server, work, plan)}
    for entry in plan:
        r = results[entry["name"]]
        assert r["ok"], f"{entry['name']}: {r}"
        fmt = "mp3" if entry["name"] == "defaults" else entry["name"]
        assert r["content_type"].startswith(CONTENT_TYPES[fmt]), r
        assert abs(ffmpeg_seconds(Path(entry["out"]).read_bytes(), fmt) - cli_seconds) < 0.15, entry["name"]
    assert results["defaults"]["voice"].startswith("me")


# --- a browser: a page on another loopback origin ----------------------------------------------------

PAGE = """<!doctype html><meta charset="utf-8"><title>cosy from another origin</title><script>
const api = "__API__", key = "__KEY__";
const out = {};
// Every step's outcome goes back to the page's own server (POST /result), which the test reads.
const report = () => fetch("/result", {method: "POST", body: JSON.stringify(out)});
async function run() {
  try {
    // What a page with the openai SDK sends: the key, JSON, the SDK's x-stainless-* headers; no
    // response_format (the server's default, mp3), then play what came back.
    const r = await fetch(api + "/v1/audio/speech", {method: "POST",
      headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json",
                "x-stainless-lang": "js", "x-stainless-os": "Linux"},
      body: JSON.stringify({model: "tts-1", voice: "alloy", input: "__TEXT__"})});
    out.status = r.status;
    out.content_type = r.headers.get("content-type");
    out.voice = r.headers.get("x-cosy-voice");
    const bytes = await r.arrayBuffer();
    out.bytes = bytes.byteLength;
    const ctx = new AudioContext();
    const audio = await ctx.decodeAudioData(bytes);
    out.decoded_s = audio.duration;
    // Played as a page plays it, to the end: a buffer source on the AudioContext.
    const source = ctx.createBufferSource();
    source.buffer = audio;
    source.connect(ctx.destination);
    await ctx.resume();
    out.context = ctx.state;
    const started = ctx.currentTime;
    await new Promise((resolve) => { source.onended = resolve; source.start(); });
    out.played_s = ctx.currentTime - started;
  } catch (e) { out.fetch_error = String(e); }
  try {
    out.voices = (await (await fetch(api + "/v1/audio/voices", {headers: {"Authorization": "Bearer " + key}})).json()).voices;
  } catch (e) { out.voices_error = String(e); }
  out.ws = await new Promise((resolve) => {
    let ws;
    try { ws = new WebSocket(api.replace("http", "ws") + "/v1/audio/speech/stream", ["cosy", "cosy-key." + key]); }
    catch (e) { resolve("throw: " + e); return; }
    ws.onopen = () => { ws.close(); resolve("open"); };
    ws.onerror = () => resolve("error");
  });
  out.done = true;
  await report();
}
run().catch((e) => { out.page_error = String(e); report(); });
</script>"""


class _PageServer:
    """A page on its own loopback port (another origin than the cosy server); `html` is set once
    the cosy server's port is known."""

    def __init__(self) -> None:
        self.html = b""
        self.result: dict[str, Any] | None = None
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page.html)))
                self.end_headers()
                self.wfile.write(page.html)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                page.result = json.loads(self.rfile.read(length) or b"{}")
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _browser_result(page: _PageServer, work: Work) -> dict[str, Any]:
    """Loads the page in headless Chromium (real time: its audio clock runs, so playback can end)
    and returns what the page posted back, waiting at most 180 s."""
    profile = work.root / f"chromium-profile-{page.origin.rsplit(':', 1)[1]}"
    log = work.root / f"chromium-{page.origin.rsplit(':', 1)[1]}.log"
    with log.open("wb") as sink:
        browser = subprocess.Popen([_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                    "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}", page.origin + "/"],
                                   stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
    try:
        deadline = time.monotonic() + 180
        while page.result is None and time.monotonic() < deadline and browser.poll() is None:
            time.sleep(0.1)
    finally:
        browser.kill()
        browser.wait()
    assert page.result is not None, f"the page posted no result (chromium exit {browser.returncode}):\n{log.read_text(errors='replace')[-2000:]}"
    return page.result


def _page(server: Server) -> str:
    return (PAGE.replace("__API__", f"http://127.0.0.1:{server.port}").replace("__KEY__", API_KEY)
            .replace("__TEXT__", DEFAULT_TEXT))


def _browse(work: Work, name: str, allowed_origin: str | None) -> dict[str, Any]:
    """Serves the page, starts cosy with `server.cors_origins` = [the page's origin] (or another
    one), loads the page in Chromium and returns what it found."""
    page = _PageServer()
    try:
        origin = allowed_origin or page.origin
        with serve(work, name, "--set", f"server.api_key={API_KEY}", "--set", f"server.cors_origins={origin}") as s:
            page.html = _page(s).encode()
            return _browser_result(page, work)
    finally:
        page.close()


def test_browser_on_an_allowed_origin_calls_the_api(work: Work, cli_seconds: float) -> None:
    got = _browse(work, "cors-open-server", None)
    assert got.get("status") == 200, got
    assert got["content_type"].startswith("audio/mpeg"), got
    # The browser's own mp3 decoder, then its audio graph played it to the end (the context's clock
    # moves in render quanta, and on a busy machine it may run late: at least the whole length).
    assert abs(got["decoded_s"] - cli_seconds) < 0.15, got
    assert got["context"] == "running" and got["played_s"] >= got["decoded_s"] - 0.05, got
    assert (got.get("voice") or "").startswith("me"), got  # the page can read cosy's exposed headers
    assert {"id": "me", "name": "me"} in got["voices"], got
    assert got["ws"] == "open", got


def test_browser_on_another_origin_is_blocked(work: Work) -> None:
    got = _browse(work, "cors-closed-server", "http://127.0.0.1:1")
    assert "status" not in got and "fetch_error" in got, got
    assert got["ws"] == "error", got

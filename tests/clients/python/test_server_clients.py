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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, skip_or_fail
from test_server_openai import API_KEY, SAMPLE_RATE, Server, Work, _serve, openai

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
def work(tmp_path_factory: pytest.TempPathFactory) -> Work:
    if openai is None:
        skip_or_fail("the openai package is not installed (pip install -r onnx/requirements.txt)")
    w = Work(tmp_path_factory.mktemp("clients"))
    w.cosy("voice", "add", "me", "--wav", str(REPO / "tests/fixtures/prompt_24k.wav"), "--text",
           "Hello there, this is a test.", "--default")
    return w


@pytest.fixture(scope="module")
def server(work: Work) -> Iterator[Server]:
    with _serve(work, "clients-server", "--set", f"server.api_key={API_KEY}") as s:
        yield s


@pytest.fixture(scope="module")
def cli_seconds(work: Work) -> float:
    """How long the same text and voice are from `cosy file` (seed and schedule as the server's)."""
    return ffmpeg_seconds(work.cli_audio("defaults.wav", DEFAULT_TEXT, "--voice", "me"), "wav")


# --- the openai Python SDK with its defaults -------------------------------------------------------

def test_python_sdk_defaults_get_mp3(server: Server, cli_seconds: float) -> None:
    """`create(model="tts-1", voice="alloy", input=...)`, nothing else: what every tutorial does."""
    with server.client(API_KEY) as client:
        r = client.audio.speech.with_raw_response.create(model="tts-1", voice="alloy", input=DEFAULT_TEXT)
        assert r.headers["content-type"].startswith("audio/mpeg")
        assert r.headers.get("x-cosy-voice", "").startswith("me")
        body = r.content
    # mp3 frames pad the end (and the encoder's delay the start): a frame or two either side.
    assert abs(ffmpeg_seconds(body, "mp3") - cli_seconds) < 0.15


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_python_sdk_every_format_decodes(server: Server, cli_seconds: float, fmt: str) -> None:
    with server.client(API_KEY) as client:
        with client.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="coral", input=DEFAULT_TEXT,
                                                                response_format=fmt) as r:  # type: ignore[arg-type]
            assert r.status_code == 200
            assert r.headers["content-type"].startswith(CONTENT_TYPES[fmt])
            body = b"".join(r.iter_bytes())
    assert abs(ffmpeg_seconds(body, fmt) - cli_seconds) < 0.15


def test_python_sdk_aac_is_refused_naming_what_is_served(server: Server) -> None:
    with server.client(API_KEY) as client, pytest.raises(openai.BadRequestError) as refused:
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


def test_node_sdk_defaults_and_formats(server: Server, work: Work, cli_seconds: float) -> None:
    plan = [{"name": "defaults", "params": {"model": "tts-1", "voice": "alloy", "input": DEFAULT_TEXT},
             "out": str(work.root / "node-defaults.bin")}]
    plan += [{"name": fmt, "params": {"model": "tts-1", "voice": "nova", "input": DEFAULT_TEXT, "response_format": fmt},
              "out": str(work.root / f"node.{fmt}")} for fmt in FORMATS]
    results = {r["name"]: r for r in _node(server, work, plan)}
    for entry in plan:
        r = results[entry["name"]]
        assert r["ok"], f"{entry['name']}: {r}"
        fmt = "mp3" if entry["name"] == "defaults" else entry["name"]
        assert r["content_type"].startswith(CONTENT_TYPES[fmt]), r
        assert abs(ffmpeg_seconds(Path(entry["out"]).read_bytes(), fmt) - cli_seconds) < 0.15, entry["name"]
    assert results["defaults"]["voice"].startswith("me")


# --- a browser: a page on another loopback origin ----------------------------------------------------

PAGE = """<!doctype html><meta charset="utf-8"><title>pending</title><pre id="out"></pre><script>
const api = "__API__", key = "__KEY__";
const out = {};
const show = () => { document.getElementById("out").textContent = JSON.stringify(out); };
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
    show();
    const ctx = new AudioContext();
    const audio = await ctx.decodeAudioData(bytes);
    out.decoded_s = audio.duration;
    show();
    // Played as a page plays it: a buffer source on the AudioContext, started. Headless Chromium's
    // virtual time does not move the audio device's clock (so `onended` never comes); that the
    // graph plays the whole buffer is checked by rendering the same graph offline.
    const source = ctx.createBufferSource();
    source.buffer = audio;
    source.connect(ctx.destination);
    await ctx.resume();
    source.start();
    out.context = ctx.state;
    show();
    const offline = new OfflineAudioContext(1, audio.length, audio.sampleRate);
    const replay = offline.createBufferSource();
    replay.buffer = audio;
    replay.connect(offline.destination);
    replay.start();
    const rendered = (await offline.startRendering()).getChannelData(0);
    let energy = 0;
    for (const x of rendered) energy += x * x;
    out.rendered_s = rendered.length / audio.sampleRate;
    out.rendered_rms = Math.sqrt(energy / rendered.length);
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
  show();
}
run();
</script>"""


class _PageServer:
    """A page on its own loopback port (another origin than the cosy server); `html` is set once
    the cosy server's port is known."""

    def __init__(self) -> None:
        self.html = b""
        page = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page.html)))
                self.end_headers()
                self.wfile.write(page.html)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _browser_result(page_url: str, work: Work) -> dict[str, Any]:
    """Loads the page in headless Chromium and returns what it wrote into #out."""
    profile = work.root / f"chromium-profile-{abs(hash(page_url))}"
    st = subprocess.run([_tool("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                         "--autoplay-policy=no-user-gesture-required",
                         f"--user-data-dir={profile}", "--virtual-time-budget=60000", "--dump-dom", page_url],
                        capture_output=True, text=True, timeout=180)
    dom = st.stdout
    start, end = dom.find('<pre id="out">'), dom.find("</pre>")
    assert start >= 0 and end > start, f"no result in the page (exit {st.returncode}):\n{dom[-2000:]}\n{st.stderr[-2000:]}"
    text = dom[start + len('<pre id="out">'):end]
    assert text, f"the page wrote nothing:\n{st.stderr[-2000:]}"
    got = json.loads(text.replace("&quot;", '"').replace("&amp;", "&"))
    assert got.get("done"), f"the page did not finish in Chromium's time budget: {got}"
    return got


def _page(server: Server) -> str:
    return (PAGE.replace("__API__", f"http://127.0.0.1:{server.port}").replace("__KEY__", API_KEY)
            .replace("__TEXT__", DEFAULT_TEXT))


def _browse(work: Work, name: str, allowed_origin: str | None) -> dict[str, Any]:
    """Serves the page, starts cosy with `server.cors_origins` = [the page's origin] (or another
    one), loads the page in Chromium and returns what it found."""
    page = _PageServer()
    try:
        origin = allowed_origin or page.origin
        with _serve(work, name, "--set", f"server.api_key={API_KEY}", "--set", f"server.cors_origins={origin}") as s:
            page.html = _page(s).encode()
            return _browser_result(page.origin + "/", work)
    finally:
        page.close()


def test_browser_on_an_allowed_origin_calls_the_api(work: Work, cli_seconds: float) -> None:
    got = _browse(work, "cors-open-server", None)
    assert got.get("status") == 200, got
    assert got["content_type"].startswith("audio/mpeg"), got
    # The browser's own mp3 decoder, then its audio graph played it to the end.
    assert abs(got["decoded_s"] - cli_seconds) < 0.15, got
    assert got["context"] == "running", got
    assert abs(got["rendered_s"] - got["decoded_s"]) < 0.01 and got["rendered_rms"] > 1e-3, got
    assert (got.get("voice") or "").startswith("me"), got  # the page can read cosy's exposed headers
    assert {"id": "me", "name": "me"} in got["voices"], got
    assert got["ws"] == "open", got


def test_browser_on_another_origin_is_blocked(work: Work) -> None:
    got = _browse(work, "cors-closed-server", "http://127.0.0.1:1")
    assert "status" not in got and "fetch_error" in got, got
    assert got["ws"] == "error", got

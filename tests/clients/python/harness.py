"""The server harness of the client tests: a folder for cosy's processes (`Work`) and `cosy serve`
on a free loopback port (`serve`), with the bundled tiny model; shared by every test module here."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from conftest import REPO, cosy_bin

try:
    import openai
except ImportError:  # the pinned requirements install it; a test without it skips (fails under CI)
    openai = None  # type: ignore[assignment]

FIXTURE = REPO / "tests/fixtures/tiny"
PROMPT_WAV = REPO / "tests/fixtures/prompt_24k.wav"
# The transcript of the default voice "me" (made from PROMPT_WAV).
VOICE_TEXT = "Hello there, this is a test."
API_KEY = "sk-cosy-test-key"
SAMPLE_RATE = 24_000
STARTUP_S = 120.0


@dataclass(frozen=True)
class Work:
    """The folder every process runs in: its HOME, graph cache, voice store and outputs."""

    root: Path

    @property
    def voices(self) -> Path:
        return self.root / "voices"

    def env(self) -> dict[str, str]:
        """The caller's environment without any COSY_* setting (and no config.toml in cwd)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("COSY_")}
        # XDG_RUNTIME_DIR: the server's default local socket is this folder's own (docs/desktop.md).
        env.update(HOME=str(self.root), COSY_GRAPH_CACHE=str(self.root / "gc"), XDG_RUNTIME_DIR=str(self.root / "run"))
        return env

    def command(self, *args: str) -> list[str]:
        return [str(cosy_bin()), "--model", str(FIXTURE), "--provider", "cpu", "--set", f"voices.dir={self.voices}", *args]

    def cosy(self, *args: str) -> None:
        """The command line run here, as the reference: never through a server of this folder's
        (COSY_SERVER=off; servers under test may be listening on its local socket)."""
        env = {**self.env(), "COSY_SERVER": "off"}
        st = subprocess.run(self.command(*args), cwd=self.root, env=env, capture_output=True, text=True, timeout=300)
        assert st.returncode == 0, f"cosy {' '.join(args)} failed:\n{st.stderr}"

    def cli_audio(self, name: str, *args: str) -> bytes:
        """`cosy file TEXT ARGS -o NAME`, the bytes it wrote."""
        out = self.root / name
        self.cosy("file", *args, "-o", str(out))
        return out.read_bytes()


@dataclass(frozen=True)
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    # The Wyoming port, when the server was started with one (`serve(..., wyoming=True)`).
    wyoming_port: int | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def client(self, api_key: str = "unused") -> openai.OpenAI:
        # No retries (an error must surface as it is) and no proxy from the environment.
        return openai.OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=120.0,
                             http_client=openai.DefaultHttpxClient(trust_env=False))


def _log_text(log: Path) -> str:
    return log.read_text(errors="replace") if log.is_file() else ""


def _wait_listening(proc: subprocess.Popen[bytes], log: Path) -> int:
    """The port from the `cosy serve: listening on http://127.0.0.1:PORT` line on stderr."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        m = re.search(r"cosy serve: listening on http://127\.0\.0\.1:(\d+)", _log_text(log))
        if m:
            return int(m.group(1))
        assert proc.poll() is None, f"cosy serve exited with {proc.returncode}:\n{_log_text(log)}"
        time.sleep(0.05)
    raise AssertionError(f"cosy serve printed no listening line in {STARTUP_S} s:\n{_log_text(log)}")


def _wait_wyoming(proc: subprocess.Popen[bytes], log: Path) -> int:
    """The port from the `cosy serve: wyoming on tcp://127.0.0.1:PORT` line, read once the server is
    ready: it is printed after the HTTP line and before the model loads, so a read right after the
    HTTP line could come before it."""
    m = re.search(r"cosy serve: wyoming on tcp://127\.0\.0\.1:(\d+)", _log_text(log))
    assert m, f"cosy serve printed no wyoming line:\n{_log_text(log)}"
    return int(m.group(1))


def _wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Polls GET /ready until it answers 200 (503 while the model loads)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"cosy serve exited with {proc.returncode}:\n{_log_text(log)}"
        try:
            with opener.open(f"http://127.0.0.1:{port}/ready", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"cosy serve was not ready in {STARTUP_S} s:\n{_log_text(log)}")


@contextmanager
def serve(work: Work, name: str, *settings: str, wyoming: bool = False) -> Iterator[Server]:
    """`cosy serve` on a free loopback port until the block ends; then SIGTERM, which must exit 0. With
    `wyoming`, the Wyoming server too, on another free loopback port."""
    log = work.root / f"{name}.log"
    extra = ["--wyoming", "127.0.0.1:0"] if wyoming else []
    with log.open("wb") as sink:
        proc = subprocess.Popen([*work.command(*settings), "serve", "--bind", "127.0.0.1:0", *extra], cwd=work.root,
                                env=work.env(), stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
    try:
        port = _wait_listening(proc, log)
        _wait_ready(proc, port, log)
        wyoming_port = _wait_wyoming(proc, log) if wyoming else None
        yield Server(proc, port, log, wyoming_port)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"cosy serve did not stop within 60 s of SIGTERM:\n{_log_text(log)}") from None
    assert rc == 0, f"cosy serve exited with {rc} after SIGTERM:\n{_log_text(log)}"

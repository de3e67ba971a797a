"""Fixtures of the Python package's tests: the checkout's tiny model and prompt, the built `cosy`
binary to compare against, and a clean user environment (HOME, working folder, no COSY_*
variables) shared by the engine in this process and the binary's runs. A test that cannot run
skips here and fails under CI=true."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
MODEL = REPO / "tests/fixtures/tiny"
PROMPT_WAV = REPO / "tests/fixtures/prompt_24k.wav"
PROMPT_TEXT = "This recording is the voice prompt."


def in_ci() -> bool:
    return os.environ.get("CI", "") not in ("", "0", "false")


def skip_or_fail(why: str) -> None:
    if in_ci():
        pytest.fail(f"CI=true and {why}: CI must run every test", pytrace=False)
    pytest.skip(why)


def cosy_bin() -> Path:
    """The built cosy binary (COSY_BIN, else the checkout's debug or release build)."""
    named = os.environ.get("COSY_BIN")
    for p in ([Path(named)] if named else []) + [REPO / "target/debug/cosy", REPO / "target/release/cosy"]:
        if p.is_file():
            return p
    skip_or_fail("no built cosy binary (cargo build; scripts/test.sh builds it)")
    raise AssertionError


class Home:
    """One user's folder: HOME, the working folder, the voices and graph caches of both the
    engine in this process and the binary's runs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.voices = path / "voices"
        self.env: Dict[str, str] = {k: v for k, v in os.environ.items() if not k.startswith("COSY_") and k != "ORT_DYLIB_PATH"}
        self.env["HOME"] = str(path)
        self.env["XDG_CONFIG_HOME"] = str(path / ".config")
        self.env["XDG_DATA_HOME"] = str(path / ".local/share")
        self.env["XDG_CACHE_HOME"] = str(path / ".cache")
        self.env["COSY_GRAPH_CACHE"] = str(path / "gc")
        # The per-user socket of a running `cosy serve` would be found here: this folder's own.
        self.env["XDG_RUNTIME_DIR"] = str(path / "run")
        (path / "run").mkdir(mode=0o700, exist_ok=True)

    def settings(self) -> Dict[str, object]:
        """The engine's settings matching :meth:`cli`'s flags."""
        return {"runtime": {"providers": "cpu"}, "voices": {"dir": str(self.voices)}}

    def cli(self, *args: str, stdin: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        cmd: List[str] = [str(cosy_bin()), "--model", str(MODEL), "--provider", "cpu", "--set", f"voices.dir={self.voices}", *args]
        # The binary as the reference: loading the model itself, never asking a server.
        env = {**self.env, "COSY_SERVER": "off"}
        out = subprocess.run(cmd, cwd=self.path, env=env, input=stdin, capture_output=True, timeout=600)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {out.returncode}: {out.stderr.decode(errors='replace')}")
        return out


@pytest.fixture(scope="session")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    """The session's user folder, made this process's environment (the engine reads it)."""
    h = Home(tmp_path_factory.mktemp("home"))
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(h.env)
    os.chdir(h.path)
    try:
        yield h
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@pytest.fixture(scope="session")
def engine(home: Home) -> "object":
    import cosy

    return cosy.Engine(MODEL, **home.settings())


def read_wav_f32(path: Path) -> np.ndarray:
    """The samples of a 32-bit float WAV (format 3), as `cosy file --format wavf32` writes it."""
    data = path.read_bytes()
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", f"{path}: not a WAV file"
    pos = 12
    fmt_tag = None
    while pos + 8 <= len(data):
        tag, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = data[pos + 8 : pos + 8 + size]
        if tag == b"fmt ":
            fmt_tag = int.from_bytes(body[:2], "little")
        elif tag == b"data":
            assert fmt_tag in (3, 0xFFFE), f"{path}: not float samples (format {fmt_tag})"
            return np.frombuffer(body, dtype="<f4").astype(np.float32)
        pos += 8 + size + (size & 1)
    raise AssertionError(f"{path}: no data chunk")

"""The client tests' own fixtures: where the checkout and the built cosy binary are, and the CI rule
(a test that cannot run skips here, fails under CI=true). These tests run in a small venv of their
own (tests/clients/requirements.txt), not the exporter's torch venv."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def in_ci() -> bool:
    """True under CI (`CI=true`), where a missing client or binary fails the run instead of skipping."""
    return os.environ.get("CI", "") not in ("", "0", "false")


def skip_or_fail(why: str) -> None:
    """Skip (printing why) outside CI; under CI a test that cannot run is a failure."""
    if in_ci():
        pytest.fail(f"CI=true and {why}: CI must run every test", pytrace=False)
    pytest.skip(why)


def cosy_bin() -> Path:
    """The built cosy binary (debug first, as scripts/test.sh builds it); skip or fail without one."""
    for p in (REPO / "target/debug/cosy", REPO / "target/release/cosy"):
        if p.is_file():
            return p
    skip_or_fail("no built cosy binary (run cargo build first; scripts/test.sh does)")
    raise AssertionError


# The fixtures every client test module shares (module-scoped: each module gets its own folder and
# server). Imported here, after the helpers above, which harness.py uses.
from collections.abc import Iterator  # noqa: E402

from harness import API_KEY, PROMPT_WAV, VOICE_TEXT, Server, Work, openai, serve  # noqa: E402


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Work:
    if openai is None:
        skip_or_fail("the openai package is not installed (scripts/setup.sh --python installs tests/clients/requirements.txt)")
    w = Work(tmp_path_factory.mktemp("serve"))
    w.cosy("voice", "add", "me", "--wav", str(PROMPT_WAV), "--text", VOICE_TEXT, "--default")
    return w


@pytest.fixture(scope="module")
def auth_server(work: Work) -> Iterator[Server]:
    with serve(work, "auth-server", "--set", f"server.api_key={API_KEY}") as s:
        yield s

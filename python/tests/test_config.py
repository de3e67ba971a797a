"""The binary's configuration rules in Python: the same config file (with `cosy serve`'s own
sections and variables, which the engine accepts and leaves alone), `COSY_*`, keyword settings."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator, List

import pytest

import cosy
from conftest import MODEL, REPO, Home

CONFIG_TOML = REPO / "config.toml"


def server_variables() -> List[str]:
    """The variables config.toml documents for `[server]`, `[wyoming]` and `[say]` (`env COSY_X`)."""
    names: List[str] = []
    section = ""
    for line in CONFIG_TOML.read_text().splitlines():
        m = re.match(r"^\[([a-z_.]+)\]", line)
        if m:
            section = m.group(1)
        if section.split(".")[0] in ("server", "wyoming", "say"):
            names += re.findall(r"env (COSY_[A-Z_]+)", line)
    return names


@pytest.fixture()
def env(home: Home) -> Iterator[None]:
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_the_checkout_config_with_server_sections_and_variables_loads(home: Home, env: None) -> None:
    variables = server_variables()
    assert {"COSY_BIND", "COSY_API_KEY", "COSY_WYOMING", "COSY_SERVER"} <= set(variables), variables
    for name in variables:
        os.environ[name] = {"COSY_API_KEY": "k", "COSY_SERVER": "http://127.0.0.1:1"}.get(name, "127.0.0.1:1")
    engine = cosy.Engine(MODEL, CONFIG_TOML, runtime={"providers": "cpu"})
    assert Path(engine.model_dir).resolve() == MODEL.resolve()


def test_a_misspelt_variable_or_key_is_refused(home: Home, env: None) -> None:
    os.environ["COSY_THREDS"] = "2"
    with pytest.raises(cosy.ConfigError, match="COSY_THREDS"):
        cosy.Engine(MODEL)
    del os.environ["COSY_THREDS"]
    with pytest.raises(cosy.ConfigError, match="engine.max_in_flite"):
        cosy.Engine(MODEL, engine__max_in_flite=2)
    with pytest.raises(cosy.ConfigError, match="max_in_flight"):
        cosy.Engine(MODEL, engine={"max_in_flight": 0})


def test_settings_as_keywords_mean_the_same_key() -> None:
    from cosy import _settings

    assert _settings({"engine": {"max_in_flight": 4}}) == [("engine.max_in_flight", "4")]
    assert _settings({"engine__max_in_flight": 4}) == [("engine.max_in_flight", "4")]
    assert _settings({"engine.max_in_flight": 4}) == [("engine.max_in_flight", "4")]
    assert _settings({"runtime": {"providers": ["cuda", "cpu"], "allow_fallback": True}}) == [
        ("runtime.providers", "cuda,cpu"),
        ("runtime.allow_fallback", "true"),
    ]


def test_a_config_file_in_the_working_folder_is_read(home: Home, env: None, tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text("[engine]\nmax_in_flight = 0\n")
    os.chdir(tmp_path)
    try:
        with pytest.raises(cosy.ConfigError, match="config.toml"):
            cosy.Engine(MODEL)
    finally:
        os.chdir(home.path)

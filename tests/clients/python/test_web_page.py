"""cosy's own web page (`GET /`) in Debian's headless Chromium, driven through playwright-core
(tests/clients/node/web_page.mjs) against the real server with the bundled tiny model and an API
key: it loads with no console error and no request outside the server's origin, takes the sample
rate and the limits from the server (/v1/audio/info), an AudioContext runs, Speak with the default
voice plays audio and shows the time to first audio and where the time went, a clone from an uploaded wav is saved and listed (made default, deleted), so is one recorded
from Chromium's fake microphone, Stop cancels on the
server (in-flight back to 0, with the test hook that holds a request after its first audio), the
live mode speaks before the text box is left, and errors are the server's one-line messages.
The player buffers as `cosy say` does (src/serve/web/buffering.js): with the test hook that slows
synthesis to a third of real time it plays whole sentences with no underrun, with "No buffering"
it runs dry and counts it, and without the hook the first chunk plays at once.
Screenshots (desktop and phone width) go to out/web/; scripts/screenshots.sh copies them to docs/.

Random weights: DEFAULT_TEXT gives 2.76 s of audio with the default voice at the default seed."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest

from conftest import REPO, skip_or_fail
from harness import API_KEY, PROMPT_WAV, SAMPLE_RATE, VOICE_TEXT, Work, serve

NODE_DIR = REPO / "tests/clients/node"
SHOTS = REPO / "out/web"
DEFAULT_TEXT = "Hello, this is cosy speaking."


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        skip_or_fail(f"{name} is not installed (scripts/setup.sh --python installs it)")
    return str(path)


@pytest.fixture(scope="module")
def page_run(work: Work) -> dict[str, Any]:
    """One run of the page script against a server with the key and the test hooks on."""
    _tool("chromium")
    if not (NODE_DIR / "node_modules/playwright-core/package.json").is_file():
        skip_or_fail("playwright-core is not installed (scripts/setup.sh --python runs npm ci in tests/clients/node)")
    with serve(work, "web-server", "--set", f"server.api_key={API_KEY}", "--set", "debug.test_hooks=true") as s:
        origin = f"http://127.0.0.1:{s.port}"
        st = subprocess.run([_tool("node"), str(NODE_DIR / "web_page.mjs"), origin, API_KEY, str(PROMPT_WAV), VOICE_TEXT, str(SHOTS)],
                            cwd=NODE_DIR, capture_output=True, text=True, timeout=600)
    assert st.returncode == 0, st.stderr
    lines = [line for line in st.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the page script printed no result:\n{st.stdout}\n{st.stderr}"
    got: dict[str, Any] = json.loads(lines[-1])
    (SHOTS / "result.json").write_text(json.dumps(got, indent=1))  # what the page did, for a person to read
    assert got.get("ok"), f"the page script failed in phase {got.get('phase')}: {got.get('failure')}\n{json.dumps(got, indent=1)[:4000]}"
    return got


def test_page_loads_clean_and_self_contained(page_run: dict[str, Any]) -> None:
    load = page_run["steps"]["load"]
    assert load["status"] == 200
    assert "default-src 'none'" in load["csp"] and "connect-src 'self'" in load["csp"], load
    assert page_run["outside_requests"] == [], page_run["outside_requests"]
    # The error phase's failed requests are logged by Chromium itself ("Failed to load resource");
    # before it, nothing at all.
    early = [e for e in page_run["console_errors"] if e["phase"] != "errors"]
    assert early == [], early
    late = [e for e in page_run["console_errors"] if "Failed to load resource" not in e["text"]]
    assert late == [], late
    assert page_run["steps"]["audio_context"] == {"state": "running", "advanced": True}
    assert page_run["steps"]["voices"]["key_field"] == API_KEY
    assert "me (default)" in page_run["steps"]["voices"]["options"]


def test_the_sample_rate_and_limits_are_the_servers(page_run: dict[str, Any]) -> None:
    info = page_run["steps"]["info"]
    told = info["state"]
    assert told["sample_rate"] == SAMPLE_RATE, info
    limit = told["max_prompt_seconds"]
    assert 0 < limit <= 30 and info["hint"] == f" (at most {limit:g} s)", info
    assert info["speed"] == {"min": "0.25", "max": "4"}, info


def test_speak_plays_the_default_voice_as_it_streams(page_run: dict[str, Any]) -> None:
    speak = page_run["steps"]["speak"]
    s = speak["state"]
    assert s["audioContext"] == "running" and s["error"] is None and speak["error_hidden"], speak
    # Played to the end: every sample scheduled on the AudioContext has played.
    assert s["playedSamples"] == s["scheduledSamples"] > 0, s
    assert abs(s["audioSeconds"] - 2.76) < 0.05, s
    assert s["chunks"] >= 2, "pcm played piece by piece as it streamed"
    assert s["ttfaMs"] > 0 and speak["ttfa_text"].endswith(" ms"), speak
    assert s["rtf"] > 0 and speak["rtf_text"] != "–", speak
    t = s["timing"]
    assert all(t[f"{k}_s"] >= 0 for k in ("queue", "frontend", "flow", "hift")) and t["llm_s"] > 0, t
    assert 0 < t["first_audio_s"] <= t["total_s"], t
    assert [item.split(" ")[0] for item in speak["legend"]] == ["queue", "frontend", "LLM", "flow", "HiFT"], speak["legend"]
    # The download is what was played: a 16-bit mono WAV of every sample.
    assert speak["download"] == {"name": "cosy.wav", "href": True, "enabled": True}, speak["download"]
    assert s["download"] == {"bytes": 44 + 2 * round(s["audioSeconds"] * SAMPLE_RATE), "type": "audio/wav"}, s["download"]


def test_first_audio_is_not_delayed_when_synthesis_keeps_up(page_run: dict[str, Any]) -> None:
    """Without the slowing hook the gate follows the measured rate, decided on the first chunk:
    at or above real time it opens there (no wait, as without buffering); a machine slower than
    that (a debug build under load) holds with a rate below 1, as the rule says."""
    player = page_run["steps"]["speak"]["player"]
    assert player["buffering"] is True, player
    first = player["decisions"][0]
    assert first["arrivals"] == 1, player
    if first["rate"] is None or first["rate"] >= 1:  # JSON has no Infinity: an instant chunk
        assert (first["gate"], first["reason"]) == ("open", "keeps_up"), player
    else:
        assert first["gate"] == 0 and first["reason"] == "slow", player


def test_slow_synthesis_buffers_whole_sentences_without_underruns(page_run: dict[str, Any]) -> None:
    """With synthesis at a third of real time (the test hook), the page buffers each whole sentence
    as `cosy say` does: it waits from the first chunk (and says so), releases up to each sentence
    end the event stream tells, plays to the end and never runs dry once playing."""
    step = page_run["steps"]["buffered"]
    s, player = step["state"], step["player"]
    assert s["error"] is None and s["playedSamples"] == s["scheduledSamples"] > 0, s
    assert player["buffering"] is True and player["underruns"] == 0, player
    first = player["decisions"][0]
    assert (first["gate"], first["reason"], first["waiting"], first["arrivals"]) == (0, "slow", True, 1), player
    assert 0 < first["rate"] <= 0.34, player
    ends = player["sentenceEnds"]
    assert len(ends) == 3 and ends == sorted(ends), player
    releases = [d["gate"] for d in player["decisions"] if d["reason"] == "sentence_buffered"]
    assert releases and set(releases) <= set(ends), player
    # Playback started while audio was still coming: the first sentence was released before the
    # last chunk arrived.
    done = player["decisions"][-1]
    first_release = next(d for d in player["decisions"] if d["reason"] == "sentence_buffered")
    assert done["reason"] == "done" and first_release["arrivals"] < done["arrivals"], player
    assert player["notice"] is True and step["notice_hidden_after"], step


def test_no_buffering_plays_as_it_comes_and_the_player_counts_underruns(page_run: dict[str, Any]) -> None:
    """The same slow request with "No buffering": no decisions, each chunk played as it comes, and
    the player runs dry between chunks (each arrives three times its length after the last)."""
    step = page_run["steps"]["unbuffered"]
    s, player = step["state"], step["player"]
    assert s["error"] is None and s["playedSamples"] == s["scheduledSamples"] > 0, s
    assert player["buffering"] is False and player["decisions"] == [] and player["notice"] is False, player
    assert player["underruns"] >= 1, player


def test_other_formats_play_once_complete_and_download_as_received(page_run: dict[str, Any]) -> None:
    mp3 = page_run["steps"]["mp3"]
    s = mp3["state"]
    assert s["error"] is None and s["playedSamples"] == s["scheduledSamples"] > 0, s
    assert s["download"]["type"] == "audio/mpeg" and s["download"]["bytes"] > 0 and mp3["download_name"] == "cosy.mp3", mp3
    assert abs(s["audioSeconds"] - 2.76) < 0.05 and s["timing"] is not None, s


def test_phone_width_has_no_sideways_scroll(page_run: dict[str, Any]) -> None:
    assert page_run["steps"]["phone"]["scroll_width"] <= 390
    for name in ("web-desktop.png", "web-phone.png"):
        shot = SHOTS / name
        assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", shot


def test_clone_from_an_uploaded_wav_is_saved_and_listed(page_run: dict[str, Any]) -> None:
    clone = page_run["steps"]["clone"]
    assert clone["error"] is None, clone
    saved = {v["name"]: v for v in clone["state"]}
    assert saved["uploaded"]["transcript"] == VOICE_TEXT and saved["uploaded"]["usable"] is True, saved
    assert "uploaded" in clone["listed"] and clone["selected"] == "uploaded", clone
    after = page_run["steps"]["voices_after"]["state"]
    assert after == {"voices": ["me"], "default": "me"}, after


def test_clone_from_the_microphone_is_uploaded_as_wav(page_run: dict[str, Any]) -> None:
    mic = page_run["steps"]["mic"]
    assert mic["error"] is None, mic
    rec = mic["recording"]
    # MediaRecorder's webm/Opus, decoded by the page: a 16-bit mono WAV of what was recorded.
    assert rec["source"] == "microphone" and "webm" in rec["type"] and rec["seconds"] >= 1.0, rec
    assert rec["bytes"] > 44, rec
    assert "mic" in mic["listed"], mic


def test_stop_cancels_on_the_server(page_run: dict[str, Any]) -> None:
    stop = page_run["steps"]["stop"]
    assert stop["in_flight_held"] >= 1 and stop["in_flight_after"] == "zero", stop
    assert stop["stopped"] >= 1 and stop["cancelled_total"] >= 1 and stop["error"] is None, stop


def test_live_mode_speaks_before_the_text_box_is_left(page_run: dict[str, Any]) -> None:
    live = page_run["steps"]["live"]
    before = live["before_blur"]
    assert before["focused"] == "text", before
    assert before["state"]["firstAudioMs"] is not None and before["state"]["sessions"] == 1, before
    after = live["after"]
    assert after["live"]["done"] and after["error"] is None, after
    assert after["playedSamples"] > 0 and after["timing"] is not None, after


def test_errors_are_the_servers_one_line_messages(page_run: dict[str, Any]) -> None:
    errors = page_run["steps"]["errors"]
    assert errors["shown"] == errors["server"] and "\n" not in errors["shown"], errors
    assert errors["bad_key"] == "the API key is not valid for this server", errors


def test_keyboard_reaches_every_control_in_reading_order(page_run: dict[str, Any]) -> None:
    order = page_run["steps"]["tab_order"]
    expected = ["api-key", "text", "voice", "format", "instruct", "speed", "seed", "live", "speak", "clone-file", "record",
                "clone-text", "clone-name", "clone-default", "clone-save", "clone-try"]
    assert [c for c in order if c in expected] == expected, order


def test_web_ui_off_answers_404(work: Work) -> None:
    with serve(work, "web-off-server", "--set", "server.web_ui=false") as s:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for path in ("/", "/web/app.js"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                opener.open(f"http://127.0.0.1:{s.port}{path}", timeout=30)
            assert refused.value.code == 404
            assert "web page" not in refused.value.read().decode(), "the 404 does not name a page that is off"

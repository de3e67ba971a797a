"""The web page's port of the buffering rule (src/serve/web/buffering.js) against the shared table
of cases (tests/data/buffering_cases.json) that the Rust rule's unit tests also replay: node's test
runner runs tests/clients/node/buffering.test.mjs (no server, no browser, no clock)."""

from __future__ import annotations

import shutil
import subprocess

from conftest import REPO, skip_or_fail


def test_the_pages_rule_replays_the_shared_table() -> None:
    node = shutil.which("node")
    if node is None:
        skip_or_fail("node is not installed (scripts/setup.sh --python installs it)")
    st = subprocess.run([str(node), "--test", "tests/clients/node/buffering.test.mjs"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert st.returncode == 0, st.stdout[-4000:] + st.stderr[-2000:]
    assert "# fail 0" in st.stdout and "# pass " in st.stdout, st.stdout[-2000:]

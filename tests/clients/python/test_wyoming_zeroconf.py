"""The Wyoming server's zeroconf announcement (`wyoming.zeroconf`, `--zeroconf`; docs/wyoming.md),
seen by a real mDNS browser: python-zeroconf (pinned in tests/clients/requirements.txt), the
library Home Assistant discovers Wyoming services with. Three servers run: one without the setting
(announces nothing), one with `--zeroconf NAME`, one with `wyoming.zeroconf = true` (the name
"cosy"); the browser must see exactly the two, each with its own Wyoming port.

The servers and the browser run in a network namespace of the test's own when `unshare -rn` can
make one (zeroconf_probe.py: only a loopback with multicast on, so nothing else on the network is
seen); without one, on the host's network, with unique names. Every wait has a bound that only
guards against a hang: the browser stops as soon as both names were seen."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import skip_or_fail
from harness import Work

try:
    import zeroconf  # noqa: F401
except ImportError:  # the pinned requirements install it; without it the test skips (fails under CI)
    zeroconf = None  # type: ignore[assignment]

PROBE = Path(__file__).with_name("zeroconf_probe.py")
GUARD_S = 120.0


def own_namespace() -> bool:
    """Whether this machine lets the test make a network namespace of its own."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30).returncode == 0


def test_zeroconf_announces_the_wyoming_server_only_when_configured(work: Work) -> None:
    if zeroconf is None:
        skip_or_fail("the zeroconf package is not installed (scripts/setup.sh --python installs tests/clients/requirements.txt)")
    netns = own_namespace()
    # In the namespace only its loopback exists; on the host, every interface (and unique names).
    wyoming = "127.0.0.1:0" if netns else "0.0.0.0:0"
    suffix = uuid.uuid4().hex[:8]
    named = f"cosy-test-{suffix}"
    default = "cosy" if netns else f"cosy-default-{suffix}"
    serve = ["serve", "--bind", "127.0.0.1:0", "--wyoming", wyoming]
    servers = [
        work.command(*serve),
        work.command(*serve, "--zeroconf", named),
        work.command("--set", f"wyoming.zeroconf={'true' if netns else default}", *serve),
    ]
    spec = {"netns": netns, "servers": servers, "env": work.env(), "cwd": str(work.root), "want": [named, default], "guard_s": GUARD_S}
    cmd = [sys.executable, str(PROBE), json.dumps(spec)]
    run = subprocess.run(["unshare", "-rn", *cmd] if netns else cmd, capture_output=True, text=True, timeout=4 * GUARD_S)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(work.root.glob("zeroconf-*.log")))
    assert run.returncode == 0, f"the probe failed:\n{run.stderr}\n{logs}"
    result = json.loads(run.stdout.strip().splitlines()[-1])
    quiet, named_port, default_port = result["ports"]
    # On the host, other machines' Wyoming services may be seen too: only this test's count.
    found = {name: port for name, port in result["found"].items() if netns or suffix in name}
    assert found == {named: named_port, default: default_port}, f"netns={netns}: {result}\n{logs}"
    assert quiet not in found.values(), "a server without wyoming.zeroconf announces nothing"
    assert "announced over mDNS" in logs

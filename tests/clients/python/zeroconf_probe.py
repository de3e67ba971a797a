"""Starts `cosy serve` processes and browses mDNS for `_wyoming._tcp.local.` with python-zeroconf,
as Home Assistant's discovery does; prints what it found as JSON. Run by test_wyoming_zeroconf.py,
inside a network namespace of the test's own when it can make one (`unshare -rn`: only the
loopback, with multicast turned on, so no other machine's announcements and no firewall get in
the way), else on the host's network.

Argument: one JSON object: {"netns": bool, "servers": [[argv...], ...], "env": {...}, "cwd": str,
"want": [names...], "guard_s": float}. Each server is started and waited for (its Wyoming line,
then /ready: any announcement it makes is registered before it loads) before the next one; then
the browser runs until every wanted name was seen (the guard bounds a hang only)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from zeroconf import ServiceBrowser, ServiceListener, Zeroconf

SERVICE_TYPE = "_wyoming._tcp.local."


def setup_loopback() -> None:
    """The namespace's loopback up, with multicast, and the multicast route through it."""
    for cmd in (["ip", "link", "set", "lo", "up"], ["ip", "link", "set", "lo", "multicast", "on"],
                ["ip", "route", "add", "224.0.0.0/4", "dev", "lo"]):
        subprocess.run(cmd, check=True, timeout=30)


def start(argv: list[str], env: dict[str, str], cwd: str, log: Path, guard_s: float) -> tuple[subprocess.Popen[bytes], int]:
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
    deadline = time.monotonic() + guard_s
    http = wyoming = None
    while time.monotonic() < deadline and (http is None or wyoming is None):
        assert proc.poll() is None, f"cosy serve exited with {proc.returncode}:\n{log.read_text(errors='replace')}"
        text = log.read_text(errors="replace")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
        http = int(m.group(1)) if m else None
        m = re.search(r"wyoming on tcp://[^:]+:(\d+)", text)
        wyoming = int(m.group(1)) if m else None
        time.sleep(0.05)
    assert http and wyoming, f"cosy serve did not say where it listens:\n{log.read_text(errors='replace')}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        assert time.monotonic() < deadline, f"cosy serve was not ready:\n{log.read_text(errors='replace')}"
        try:
            with opener.open(f"http://127.0.0.1:{http}/ready", timeout=5) as r:
                if r.status == 200:
                    return proc, wyoming
        except OSError:
            pass
        time.sleep(0.05)


class Seen(ServiceListener):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self.names.add(name)

    def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        self.names.add(name)

    def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
        pass


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["netns"]:
        setup_loopback()
    procs: list[subprocess.Popen[bytes]] = []
    out: dict[str, object] = {"ports": [], "found": {}}
    try:
        for i, argv in enumerate(spec["servers"]):
            proc, port = start(argv, spec["env"], spec["cwd"], Path(spec["cwd"]) / f"zeroconf-{i}.log", spec["guard_s"])
            procs.append(proc)
            out["ports"].append(port)  # type: ignore[union-attr]
        zc = Zeroconf()
        try:
            seen = Seen()
            ServiceBrowser(zc, SERVICE_TYPE, seen)
            deadline = time.monotonic() + spec["guard_s"]
            while not set(spec["want"]) <= {n.removesuffix("." + SERVICE_TYPE) for n in seen.names} and time.monotonic() < deadline:
                time.sleep(0.05)
            found = {}
            for name in sorted(seen.names):
                info = zc.get_service_info(SERVICE_TYPE, name, timeout=5000)
                found[name.removesuffix("." + SERVICE_TYPE)] = info.port if info else None
            out["found"] = found
        finally:
            zc.close()
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(json.dumps(out))


if __name__ == "__main__":
    main()

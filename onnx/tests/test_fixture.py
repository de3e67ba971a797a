"""The committed test fixture (tests/fixtures/tiny + prompt) regenerates bit for bit."""

from __future__ import annotations

from pathlib import Path

from cosy_export.__main__ import main
from cosy_export.manifest import sha256_file

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "tiny"


def test_fixture_regenerates_bit_for_bit(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    assert main(["fixture", str(out)]) == 0
    committed = sorted(p.name for p in FIXTURE.iterdir())
    assert sorted(p.name for p in out.iterdir()) == committed
    for name in committed:
        assert sha256_file(out / name) == sha256_file(FIXTURE / name), f"{name} differs from the committed fixture"
    assert sha256_file(tmp_path / "prompt_24k.wav") == sha256_file(FIXTURE.parent / "prompt_24k.wav")


def test_fixture_is_small() -> None:
    total = sum(p.stat().st_size for p in FIXTURE.iterdir())
    assert total < 12_000_000, f"fixture grew to {total / 1e6:.1f} MB"

"""tn_assets: the TN grammars copied into a model folder and the manifest entry describing them."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import skip_or_fail

from cosy_export import tn_assets


@pytest.fixture(scope="module")
def fst_dir() -> Path:
    try:
        return tn_assets.wetext_fst_dir()
    except (ImportError, FileNotFoundError) as e:
        skip_or_fail(f"wetext grammars unavailable: {e}")
        raise


def test_copy_writes_grammars_and_entry(tmp_path: Path, fst_dir: Path) -> None:
    entry = tn_assets.copy_tn_assets(tmp_path, fst_dir)
    tn = entry["tn"]
    assert tn["engine"] == "wetext"
    assert tn["wetext_version"] == "0.0.9"
    assert tn["zh"] == {"tagger": "tn/zh_tn_tagger.fst", "verbalizer": "tn/zh_tn_verbalizer.fst"}
    assert tn["en"] == {"tagger": "tn/en_tn_tagger.fst", "verbalizer": "tn/en_tn_verbalizer.fst"}
    for lang in ("zh", "en"):
        for role in ("tagger", "verbalizer"):
            copied = tmp_path / tn[lang][role]
            source = fst_dir / lang / "tn" / f"{role}.fst"
            assert copied.read_bytes() == source.read_bytes()
            # OpenFST binary header: magic 0x7eb2fdd6, then the FST type "vector" and arc "standard".
            head = copied.read_bytes()[:32]
            assert head[:4] == bytes.fromhex("d6fdb27e") and b"vector" in head and b"standard" in head
    # zh must be the plain verbalizer (the frontend passes remove_erhua=False).
    assert (tmp_path / tn["zh"]["verbalizer"]).read_bytes() != (
        fst_dir / "zh" / "tn" / "verbalizer_remove_erhua.fst"
    ).read_bytes()


def test_missing_source_is_reported(tmp_path: Path) -> None:
    (tmp_path / "src" / "zh" / "tn").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="tagger.fst"):
        tn_assets.copy_tn_assets(tmp_path / "model", tmp_path / "src")

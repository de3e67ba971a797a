"""Text-normalisation grammars for the exported model folder.

The official CosyVoice3 frontend normalises text with `wetext` (WeTextProcessing grammars compiled
to OpenFST). `wetext==0.0.4`, the version the official requirements pin, downloads its grammars
from the ModelScope repo `pengzhendong/wetext` at run time; wetext 0.0.7 to 0.1.0 ship a snapshot of
that repo inside the wheel (`wetext/fsts/`, same README/configuration.json), with identical TN
grammars across those releases. We pin `wetext==0.0.9` (requirements.txt) and take the grammars
from the installed package, so an export needs no network beyond PyPI.

Only TN grammars are copied, for the two languages the frontend uses. For zh the frontend builds
`Normalizer(remove_erhua=False)`, i.e. the plain `verbalizer.fst`. The files are OpenFST binary
"vector" FSTs with standard (tropical, float) arcs over UTF-8 bytes; the Rust runtime reads them
as they are (`src/frontend/tn.rs`).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from pathlib import Path
from typing import Any

TN_DIR = "tn"

# (language, role) -> path inside the wetext package's `fsts/` folder.
_SOURCES: dict[tuple[str, str], str] = {
    ("zh", "tagger"): "zh/tn/tagger.fst",
    ("zh", "verbalizer"): "zh/tn/verbalizer.fst",
    ("en", "tagger"): "en/tn/tagger.fst",
    ("en", "verbalizer"): "en/tn/verbalizer.fst",
}


def tn_file_name(lang: str, role: str) -> str:
    """Name of a grammar inside the model's `tn/` folder (what `WetextNormalizer::load` expects)."""
    return f"{lang}_tn_{role}.fst"


def wetext_fst_dir() -> Path:
    """The `fsts/` folder of the installed wetext package (env COSY_WETEXT_DIR overrides the
    package folder, i.e. the folder that contains `fsts/`)."""
    override = os.environ.get("COSY_WETEXT_DIR")
    if override:
        root = Path(override)
    else:
        import wetext  # imported lazily: only export and fixture generation need it

        root = Path(wetext.__file__).parent
    fsts = root / "fsts"
    if not fsts.is_dir():
        raise FileNotFoundError(
            f"{fsts}: no wetext grammars here; install the pinned wetext (onnx/requirements.txt), "
            "whose wheel ships them"
        )
    return fsts


def copy_tn_assets(model_dir: Path, fst_dir: Path | None = None) -> dict[str, Any]:
    """Copy the zh/en TN grammars into `model_dir/tn/` and return the manifest entry.

    Returns `{"tn": {"engine": "wetext", "wetext_version": ..., "zh": {"tagger": "tn/zh_tn_tagger.fst",
    "verbalizer": "tn/zh_tn_verbalizer.fst"}, "en": {...}}}` with paths relative to `model_dir`.
    """
    src_root = fst_dir if fst_dir is not None else wetext_fst_dir()
    out_dir = Path(model_dir) / TN_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    entry: dict[str, Any] = {"engine": "wetext", "wetext_version": _wetext_version()}
    for (lang, role), rel in _SOURCES.items():
        src = src_root / rel
        if not src.is_file():
            raise FileNotFoundError(f"{src}: wetext grammar missing")
        name = tn_file_name(lang, role)
        shutil.copyfile(src, out_dir / name)
        entry.setdefault(lang, {})[role] = f"{TN_DIR}/{name}"
    return {"tn": entry}


def _wetext_version() -> str | None:
    try:
        return importlib.metadata.version("wetext")
    except importlib.metadata.PackageNotFoundError:
        return None

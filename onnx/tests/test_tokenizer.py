"""tokenizer.py: golden text tokens, special-token ids, and the shared corpus fixture."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from cosy_export import tokenizer as T

CASES = ["en", "zh", "num", "p16k", "stream"]
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="module")
def built(tiny_official: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Path]:
    out = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok = T.build_tokenizer_json(tiny_official / "CosyVoice-BlankEN", out)
    return tok, out


@pytest.mark.parametrize("case", CASES)
def test_golden_text_tokens(built, golden: Path, case: str) -> None:
    tok, path = built
    reloaded = Tokenizer.from_file(str(path))  # what the runtime loads
    meta = json.loads((golden / case / "meta.json").read_text(encoding="utf-8"))
    for text, name in [(meta["tts_text"], "text_token"), (meta["prompt_text"], "prompt_text_token")]:
        expected = np.load(golden / case / f"{name}.npy").reshape(-1).tolist()
        assert T.encode(tok, text) == expected, name
        assert reloaded.encode(text).ids == expected, name


def test_special_token_ids(built) -> None:
    tok, _ = built
    assert len(T.COSYVOICE3_SPECIAL_TOKENS) == 280
    assert tok.token_to_id("<|endoftext|>") == 151643
    assert tok.token_to_id("<|im_start|>") == 151644
    assert tok.token_to_id("<|im_end|>") == 151645
    documented = {"<|endofprompt|>": 151646, "[breath]": 151647, "<strong>": 151648, "</strong>": 151649,
                  "[noise]": 151650, "[laughter]": 151651, "<|endofsystem|>": 151663, "[AA]": 151664,
                  "[a]": 151748, "[ǜ]": 151923}  # fmt: skip
    for content, token_id in documented.items():
        assert tok.token_to_id(content) == token_id, content
        assert tok.encode(content).ids == [token_id], content
    assert tok.get_vocab_size() == 151924
    added = tok.get_added_tokens_decoder()
    assert len(added) == 281 and all(t.special and not t.normalized for t in added.values())


def test_special_tokens_are_atomic_and_nfc_applies(built) -> None:
    tok, _ = built
    ids = tok.encode("报道[j][ǐ]予").ids
    prefix = tok.encode("报道").ids
    assert ids[len(prefix) : len(prefix) + 2] == [tok.token_to_id("[j]"), tok.token_to_id("[ǐ]")]
    assert ids[len(prefix) + 2 :] == tok.encode("予").ids
    # NFD input is normalised to NFC before BPE (decomposed é == composed é).
    assert tok.encode("Cafe\u0301").ids == tok.encode("Caf\u00e9").ids
    assert tok.decode(tok.encode("Hello 世界 😀").ids) == "Hello 世界 😀"


def test_corpus_fixture_is_current(built) -> None:
    """tests/data/tokenizer_expected.json is what this tokenizer produces (the Rust side reuses it)."""
    tok, _ = built
    stored = json.loads((DATA / "tokenizer_expected.json").read_text(encoding="utf-8"))
    fresh = T.corpus_expectations(tok, T.read_corpus(DATA / "tokenizer_corpus.txt"), source=stored["tokenizer_source"])
    assert fresh == stored
    # The documented ids (cosyvoice3.md §3.2) hold on the whole list, in order.
    specials = stored["special_ids"]
    for offset, content in enumerate(T.COSYVOICE3_SPECIAL_TOKENS[2:]):
        assert specials[content] == 151646 + offset, content
    texts = [c["text"] for c in stored["cases"]]
    assert any("<|endofprompt|>" in t for t in texts) and any("[j][ǐ]" in t for t in texts)
    for case in stored["cases"]:
        if "<|endofprompt|>" in case["text"]:
            assert 151646 in case["ids"]


def test_wrong_vocab_size_is_rejected(tiny_official: Path, tmp_path: Path) -> None:
    """Without the filler entries the specials move, which must be an error, not a silent shift."""
    src = tiny_official / "CosyVoice-BlankEN"
    dst = tmp_path / "BlankEN"
    dst.mkdir()
    for name in ["merges.txt", "tokenizer_config.json"]:
        shutil.copy(src / name, dst / name)
    vocab = json.loads((src / "vocab.json").read_text(encoding="utf-8"))
    small = {k: v for k, v in vocab.items() if v < 640}
    (dst / "vocab.json").write_text(json.dumps(small), encoding="utf-8")
    with pytest.raises(ValueError):
        T.build_tokenizer_json(dst, tmp_path / "tokenizer.json")


def test_read_merges_skips_version_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "merges.txt"
    path.write_text("#version: 0.2\nĠ a\n\nh e\n", encoding="utf-8")
    assert T.read_merges(path) == [("Ġ", "a"), ("h", "e")]
    path.write_text("#version: 0.2\nabc\n", encoding="utf-8")
    with pytest.raises(ValueError):
        T.read_merges(path)

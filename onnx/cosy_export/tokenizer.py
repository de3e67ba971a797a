"""``tokenizer.json`` for the runtime, built from the BlankEN folder (cosyvoice3.md §3.2, §9 item 23).

The official folder has no ``tokenizer.json``: transformers converts the slow Qwen2 tokenizer
(``vocab.json`` + ``merges.txt``) into a fast one, adds the tokens of ``added_tokens_decoder``, and the
CosyVoice3 wrapper then adds its own special tokens. This module rebuilds that fast tokenizer with the
``tokenizers`` library directly:

* model: byte-level BPE, no unk token, no continuing-subword prefix / end-of-word suffix, no dropout,
  no byte fallback;
* normalizer: NFC;
* pre-tokenizer: Split(Qwen2 regex, isolated) then ByteLevel(add_prefix_space=False, use_regex=False);
* decoder: ByteLevel; post-processor: ByteLevel(trim_offsets=False) (adds nothing);
* added tokens: ``added_tokens_decoder`` in id order, then the CosyVoice3 specials in official order,
  every one special, not normalized, no strip, not single-word.

Every added token's id is checked (``<|endofprompt|>`` must be 151646 on the real vocabulary, as the
official LLM asserts on it).
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

# transformers' Qwen2 pre-tokenizer regex (convert_slow_tokenizer.Qwen2Converter).
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

ENDOFTEXT = "<|endoftext|>"
ENDOFPROMPT = "<|endofprompt|>"
ENDOFPROMPT_ID = 151646  # hard-coded in the official CosyVoice3LM

_EVENT_TOKENS = [
    "<|im_start|>", "<|im_end|>", "<|endofprompt|>",
    "[breath]", "<strong>", "</strong>", "[noise]",
    "[laughter]", "[cough]", "[clucking]", "[accent]",
    "[quick_breath]",
    "<laughter>", "</laughter>",
    "[hissing]", "[sigh]", "[vocalized-noise]",
    "[lipsmack]", "[mn]", "<|endofsystem|>",
]  # fmt: skip

# CMU phones with stress digits (84), in the official order.
_CMU_PHONES = (
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 "
    "B CH D DH EH EH0 EH1 EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 "
    "JH K L M N NG OW OW0 OW1 OW2 OY OY0 OY1 OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 "
    "V W Y Z ZH"
).split()

# Pinyin initials and toned finals (176), in the official order.
_PINYIN = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié "
    "iòng ióng iù iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s "
    "sh t u uang ue un uo uà uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī "
    "uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng "
    "ér ì ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn "
    "īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ"
).split()

#: ``additional_special_tokens`` of the official ``CosyVoice3Tokenizer`` (280 entries, in order).
COSYVOICE3_SPECIAL_TOKENS: list[str] = _EVENT_TOKENS + [f"[{p}]" for p in _CMU_PHONES] + [f"[{p}]" for p in _PINYIN]


def read_merges(path: Path) -> list[tuple[str, str]]:
    """Merges as the slow Qwen2 tokenizer reads them: strip, skip the version line and blanks."""
    merges: list[tuple[str, str]] = []
    with path.open(encoding="utf-8") as handle:
        for i, line in enumerate(handle):
            line = line.strip()
            if (i == 0 and line.startswith("#version:")) or not line:
                continue
            parts = line.split()
            if len(parts) != 2:
                raise ValueError(f"{path}:{i + 1}: a merge must have two parts, got {line!r}")
            merges.append((parts[0], parts[1]))
    return merges


def _special(content: str, lstrip: bool = False, rstrip: bool = False, single_word: bool = False) -> AddedToken:
    return AddedToken(content, single_word=single_word, lstrip=lstrip, rstrip=rstrip, normalized=False, special=True)


def build_tokenizer(blanken_dir: str | Path) -> Tokenizer:
    """The CosyVoice3 text tokenizer as a ``tokenizers.Tokenizer``."""
    blanken = Path(blanken_dir)
    vocab: dict[str, int] = json.loads((blanken / "vocab.json").read_text(encoding="utf-8"))
    merges = read_merges(blanken / "merges.txt")
    config = json.loads((blanken / "tokenizer_config.json").read_text(encoding="utf-8"))

    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)), use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)

    # 1. The tokens the folder declares, at the ids it declares.
    declared = sorted(((int(k), v) for k, v in config.get("added_tokens_decoder", {}).items()), key=lambda kv: kv[0])
    for token_id, spec in declared:
        token = AddedToken(
            spec["content"],
            single_word=bool(spec.get("single_word", False)),
            lstrip=bool(spec.get("lstrip", False)),
            rstrip=bool(spec.get("rstrip", False)),
            normalized=bool(spec.get("normalized", False)),
            special=bool(spec.get("special", True)),
        )
        if spec.get("special", True):
            tok.add_special_tokens([token])
        else:
            tok.add_tokens([token])
        got = tok.token_to_id(spec["content"])
        if got != token_id:
            raise ValueError(f"{spec['content']!r} landed on id {got}, tokenizer_config says {token_id}")

    # 2. eos/pad (<|endoftext|>) and the CosyVoice3 specials, in the official order; existing ones keep their id.
    expected_next = None
    for content in [ENDOFTEXT, *COSYVOICE3_SPECIAL_TOKENS]:
        existing = tok.token_to_id(content)
        tok.add_special_tokens([_special(content)])
        got = tok.token_to_id(content)
        if existing is not None:
            if got != existing:
                raise ValueError(f"{content!r} moved from id {existing} to {got}")
            continue
        if expected_next is not None and got != expected_next:
            raise ValueError(f"{content!r} landed on id {got}, expected {expected_next}")
        expected_next = got + 1
    return tok


def check_special_ids(tok: Tokenizer) -> None:
    """Raise if the CosyVoice3 specials are not at the ids the official code relies on (real vocab)."""
    first = tok.token_to_id(ENDOFPROMPT)
    if first != ENDOFPROMPT_ID:
        raise ValueError(f"{ENDOFPROMPT} has id {first}, the official LLM requires {ENDOFPROMPT_ID}")
    new_tokens = COSYVOICE3_SPECIAL_TOKENS[2:]
    for offset, content in enumerate(new_tokens):
        if tok.token_to_id(content) != ENDOFPROMPT_ID + offset:
            raise ValueError(f"{content!r} has id {tok.token_to_id(content)}, expected {ENDOFPROMPT_ID + offset}")


def encode(tok: Tokenizer, text: str) -> list[int]:
    """Ids as the official ``tokenizer.encode(text)``: no BOS/EOS, specials matched atomically."""
    return tok.encode(text, add_special_tokens=True).ids


def build_tokenizer_json(blanken_dir: str | Path, out_path: str | Path, require_official_ids: bool = True) -> Tokenizer:
    """Build the tokenizer from ``blanken_dir`` and write it to ``out_path`` (tokenizer.json).

    With ``require_official_ids`` the specials must sit at 151646.. as in the released model.
    """
    tok = build_tokenizer(blanken_dir)
    if require_official_ids:
        check_special_ids(tok)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out), pretty=False)  # compact: the padded vocabulary dominates the size
    return tok


# ----------------------------------------------------------------------------------------------------
# Corpus fixtures shared with the Rust tests
# ----------------------------------------------------------------------------------------------------

#: Texts with line breaks, which a one-text-per-line corpus file cannot hold.
MULTILINE_CORPUS_TEXTS = ["first line\nsecond line", "windows\r\nline end", "trailing newlines\n\n", "中文\n换行"]


def read_corpus(path: str | Path) -> list[str]:
    """One text per line (``\\n`` terminated, kept verbatim otherwise), then the multi-line texts."""
    raw = Path(path).read_text(encoding="utf-8")
    if raw and not raw.endswith("\n"):
        raise ValueError(f"{path}: the last line must end with a newline")
    return raw.split("\n")[:-1] + MULTILINE_CORPUS_TEXTS


def corpus_expectations(tok: Tokenizer, texts: list[str], source: str) -> dict:
    """Ids and decodings of ``texts`` plus the special-token ids, as the Rust tests consume them."""
    cases = []
    for text in texts:
        ids = encode(tok, text)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "decoded": tok.decode(ids, skip_special_tokens=False),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    specials = {content: tok.token_to_id(content) for content in [ENDOFTEXT, *COSYVOICE3_SPECIAL_TOKENS]}
    return {"tokenizer_source": source, "vocab_size": tok.get_vocab_size(), "special_ids": specials, "cases": cases}


def write_corpus_expectations(tok: Tokenizer, corpus_path: str | Path, out_path: str | Path, source: str) -> dict:
    """Write :func:`corpus_expectations` of the corpus file to ``out_path`` (stable, pretty JSON)."""
    data = corpus_expectations(tok, read_corpus(corpus_path), source)
    Path(out_path).write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return data


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Build tokenizer.json from a CosyVoice-BlankEN folder.")
    parser.add_argument("blanken_dir")
    parser.add_argument("out_json")
    parser.add_argument("--corpus", help="also record ids of this corpus file ...")
    parser.add_argument("--expected", help="... into this JSON file")
    args = parser.parse_args(argv)
    tok = build_tokenizer_json(args.blanken_dir, args.out_json)
    if args.corpus and args.expected:
        write_corpus_expectations(tok, args.corpus, args.expected, source=Path(args.blanken_dir).name)


if __name__ == "__main__":
    main()

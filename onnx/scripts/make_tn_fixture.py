"""Write tests/data/tn_cases.json: what the official frontend's wetext normaliser returns.

The official frontend (wetext==0.0.4) does, for TN:

    text = text.strip()
    lang = "zh" if any CJK ideograph (U+4E00..U+9FFF) in text else "en"
    if re.search(r"\\d", text):
        text = verbalizer(TokenParser(lang, "tn").reorder(tagger(text)))

where tagger/verbalizer are kaldifst `TextNormalizer`s over the grammars `{lang}/tn/tagger.fst` and
`{lang}/tn/verbalizer.fst` (zh: remove_erhua=False). wetext 0.0.4 fetches those grammars from
ModelScope at run time; the pinned wetext 0.0.9 wheel ships the same repo snapshot, and its
`token_parser.py` is byte-identical to 0.0.4's. Later wetext releases changed the Python driver
(they strip outputs and route all-digit text to zh), so `expected` is computed with the 0.0.4
driver above, using kaldifst and wetext's TokenParser directly. For reference each case also
records what the installed wetext's own `Normalizer(remove_erhua=False).normalize` returns.

Usage (from onnx/): python scripts/make_tn_fixture.py [--out PATH] [--random N --random-out PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from pathlib import Path

import kaldifst
import wetext
from wetext.token_parser import TokenParser

ONNX_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ONNX_DIR))

from cosy_export.tn_assets import _SOURCES, _wetext_version, wetext_fst_dir  # noqa: E402

DEFAULT_OUT = ONNX_DIR.parent / "tests" / "data" / "tn_cases.json"

# (what the case exercises, text). Texts are given already stripped, as the frontend passes them.
CASES: list[tuple[str, str]] = [
    ("zh date", "今天是2024年3月5日"),
    ("zh iso date", "会议在2023-10-01举行"),
    ("zh dotted date", "截止到2024.05.20"),
    ("zh year", "2008年北京奥运会"),
    ("zh time", "现在是下午3:45"),
    ("zh time with seconds", "时间是12:30:15"),
    ("zh money yuan sign", "价格是￥1,234.56元"),
    ("zh money dollar", "他花了$100美元"),
    ("zh money wan yi", "约合1.2万亿元"),
    ("zh percent decimal", "增长了35.5%"),
    ("zh percent", "成功率为100%"),
    ("zh negative temperature", "气温-3.5℃"),
    ("zh negative number", "负数-25"),
    ("zh degree celsius", "温度是36.5°C"),
    ("zh units kg m", "体重70kg，身高1.75m"),
    ("zh unit speed", "速度是120km/h"),
    ("zh square metre", "面积100m²"),
    ("zh mobile phone", "请拨打13812345678"),
    ("zh hotline", "客服电话：400-800-1234"),
    ("zh landline", "座机010-12345678"),
    ("zh fraction", "三分之二可以写成2/3"),
    ("zh fraction of people", "1/4的人"),
    ("zh ordinal", "他排名第1"),
    ("zh large cardinal", "共有1234567个人"),
    ("zh decimal", "圆周率约为3.14159"),
    ("zh mixed latin model", "iPhone 15 Pro售价7999元"),
    ("zh measure word", "我买了3斤苹果"),
    ("zh score", "比分是3:2"),
    ("zh room number", "房间号是302"),
    ("zh approx", "这本书有300多页"),
    ("zh erhua kept", "他今年18岁了，全新版本儿，简直666"),
    ("zh mixed 5G 4K", "5G网络和4K电视"),
    ("zh full-width digits", "价格１２３元"),
    ("zh full-width date", "１０月１日是国庆节"),
    ("zh latin with digits", "COVID-19疫情在2020年爆发"),
    ("zh no digit unchanged", "今天天气很好。"),
    ("zh percent points", "GDP增长了6.5个百分点"),
    ("zh version", "你好 WeTextProcessing 1.0，全新版本"),
    ("zh kana with CJK", "こんにちは、2024年です"),
    ("zh NUL byte (an epsilon arc in the input acceptor)", "第1\x00段"),
    ("en money date time", "I paid $12.50 on Jan. 5th, 2023 at 3:30pm."),
    ("en iso date count", "The meeting on 2024-03-05 had 1,234 people."),
    ("en percent abbreviation", "45% of them were from the U.S."),
    ("en phone", "Call 555-123-4567 now."),
    ("en measures", "It weighs 12kg and is 3.5 m long."),
    ("en ordinals", "He finished 1st, she was 2nd and I came 23rd."),
    ("en negative", "The temperature dropped to -5 degrees."),
    ("en fractions", "Add 1/2 cup of sugar and 3/4 cup of milk."),
    ("en abbreviations", "Dr. Smith lives at 221B Baker St."),
    ("en years", "The year 1999 was great, and 2000 too."),
    ("en money quantity", "It costs about $3.2 million."),
    ("en decade", "Version 2.0 was released in the 1990s."),
    ("en time am", "We need 10 mins at 7:45 a.m."),
    ("en currencies", "Mr. Jones earned €50 and £20."),
    ("en bare digits", "12345"),
    ("en ratio", "The ratio is 3:2."),
    ("en room floor", "Room 404 is on the 4th floor."),
    ("en no digit unchanged", "Hello world, Mr. Smith."),
    ("en decimal", "Pi is approximately 3.14159."),
    ("en speeds", "Speed: 60 mph, 100 km/h."),
    ("en slash date", "On 12/25/2023 we celebrated."),
    ("en small decimals", "That is 0.5% of the total, i.e. -0.25."),
    ("en kana only", "ひらがな123"),
    ("en big money", "The 3rd quarter revenue was $1,000,000."),
    ("en celsius", "Temperatures of 25°C are common."),
    ("en large number", "About 7,900,000,000 people live on Earth."),
    ("en NUL byte (an epsilon arc in the input acceptor)", "a\x001 b"),
]


def contains_chinese(text: str) -> bool:
    return any("\u4e00" <= ch <= "\u9fff" for ch in text)


class OfficialWetextTn:
    """wetext 0.0.4's TN driver over the pinned grammars (see the module docstring)."""

    def __init__(self, fst_dir: Path) -> None:
        self.taggers = {}
        self.verbalizers = {}
        for lang in ("zh", "en"):
            self.taggers[lang] = kaldifst.TextNormalizer(str(fst_dir / _SOURCES[(lang, "tagger")]))
            self.verbalizers[lang] = kaldifst.TextNormalizer(str(fst_dir / _SOURCES[(lang, "verbalizer")]))

    def normalize(self, text: str) -> tuple[str, str]:
        lang = "zh" if contains_chinese(text) else "en"
        if re.search(r"\d", text):
            tagged = self.taggers[lang](text)
            text = self.verbalizers[lang](TokenParser(lang, "tn").reorder(tagged))
        return lang, text


def random_cases(n: int, seed: int) -> list[tuple[str, str]]:
    """Seeded random sentences mixing numbers, units, symbols and words (for wider parity runs)."""
    rng = random.Random(seed)
    zh_words = ["今天", "价格", "温度", "我们", "大约", "共有", "第", "年", "月", "日", "点", "分", "元", "个",
                "公斤", "米", "下午", "上午", "电话", "比分", "增长", "，", "。", "、", "：", "的", "是"]
    en_words = ["the", "price", "is", "about", "on", "at", "Dr.", "St.", "Mr.", "and", "of", "room",
                "floor", "people", "km", "kg", "mph", "a.m.", "p.m.", ",", ".", ";", "in", "we", "paid"]
    symbols = ["$", "%", "-", "/", ":", ".", ",", "°C", "℃", "￥", "€", "£", "+", "~", "kg", "km/h", "m²"]

    def number() -> str:
        kind = rng.randrange(8)
        if kind == 0:
            return str(rng.randrange(10))
        if kind == 1:
            return str(rng.randrange(10**rng.randrange(1, 12)))
        if kind == 2:
            return f"{rng.randrange(1000)}.{rng.randrange(1000)}"
        if kind == 3:
            return f"{rng.randrange(1900, 2100)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
        if kind == 4:
            return f"{rng.randrange(24)}:{rng.randrange(60):02d}"
        if kind == 5:
            return f"{rng.randrange(1, 10)}/{rng.randrange(1, 10)}"
        if kind == 6:
            return f"{rng.randrange(1, 1000):,}".replace(",", rng.choice([",", ""])) + str(rng.randrange(1000))
        return "-" + str(rng.randrange(100))

    out = []
    for i in range(n):
        zh = i % 2 == 0
        words = zh_words if zh else en_words
        parts = []
        for _ in range(rng.randrange(2, 9)):
            r = rng.random()
            parts.append(number() if r < 0.35 else rng.choice(symbols) if r < 0.5 else rng.choice(words))
        sep = "" if zh else " "
        text = sep.join(parts).strip()
        if text:
            out.append(("random zh" if zh else "random en", text))
    return out


def build(cases: list[tuple[str, str]], tn: OfficialWetextTn, installed: object) -> list[dict]:
    rows = []
    for what, text in cases:
        assert text == text.strip(), f"case {what!r} must be given stripped"
        lang, expected = tn.normalize(text)
        try:
            via_installed = installed.normalize(text)  # type: ignore[attr-defined]
        except Exception as e:  # the installed driver may differ; record, do not fail
            via_installed = f"<error: {type(e).__name__}>"
        rows.append({"what": what, "input": text, "lang": lang, "expected": expected,
                     "installed_wetext": via_installed})
    return rows


def write(rows: list[dict], out: Path, version: str | None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "generator": "onnx/scripts/make_tn_fixture.py",
        "wetext_version": version,
        "driver": "wetext 0.0.4 TN (official pin) over the wetext wheel's grammars via kaldifst",
        "cases": rows,
    }
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    differ = sum(r["expected"] != r["installed_wetext"] for r in rows)
    print(f"{out}: {len(rows)} cases ({differ} where the installed wetext driver differs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--random", type=int, default=0, help="also write N seeded random cases")
    ap.add_argument("--random-out", type=Path, default=Path("/tmp/tn_random_cases.json"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    fst_dir = wetext_fst_dir()
    tn = OfficialWetextTn(fst_dir)
    installed = wetext.Normalizer(remove_erhua=False)
    version = _wetext_version()
    write(build(CASES, tn, installed), args.out, version)
    if args.random:
        write(build(random_cases(args.random, args.seed), tn, installed), args.random_out, version)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The acceptance table of issue 29 from one bench/gpu.sh run (before and after side by side).

    python3 bench/gpu_table.py FILES_DIR [--md table.md] [--json table.json]

Reads profile-{before,after}-{offline,stream}.json (cosy profile --json), conc-{label}.jsonl
(examples/concurrency), finite-{label}.txt, golden-*.txt, trt-rtx*.txt and ort-decode.json. A value
that a step did not produce is "–" and its row is not passed. Standard library only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
from typing import Any, Callable

LABELS = ("before", "after")


def read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def conc_rows(path: str) -> list[dict[str, Any]]:
    rows = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        rows.append(json.loads(line))
                    except ValueError:
                        pass
    except OSError:
        pass
    return rows


def cell(rows: list[dict[str, Any]], mode: str, c: int, key: str) -> float | None:
    for r in rows:
        if r.get("mode") == mode and r.get("concurrency") == c:
            v = r.get(key)
            return float(v) if isinstance(v, (int, float)) and v == v else None
    return None


def measures(files: str, label: str) -> dict[str, float | None]:
    off = read_json(os.path.join(files, f"profile-{label}-offline.json")) or {}
    stream = read_json(os.path.join(files, f"profile-{label}-stream.json")) or {}
    hop15 = read_json(os.path.join(files, f"profile-{label}-stream-hop15.json")) or {}
    rows = conc_rows(os.path.join(files, f"conc-{label}.jsonl"))
    decode = (off.get("stages") or {}).get("llm.decode") or {}
    c1 = cell(rows, "llm", 1, "llm_decode_tokens_per_s")
    c16 = cell(rows, "llm", 16, "llm_decode_tokens_per_s")
    finite = read_text(os.path.join(files, f"finite-{label}.txt")) or ""
    bad = [int(n) for n in re.findall(r"non-finite samples (\d+)", finite)]
    return {
        "decode_ms_per_token_profile": decode.get("p50_ms"),
        "decode_ms_per_token_c1": 1000.0 / c1 if c1 else None,
        "decode_x_c16": c16 / c1 if c1 and c16 else None,
        "stream_first_audio_ms": stream.get("ttfb_ms"),
        "stream_first_audio_hop15_ms": hop15.get("ttfb_ms"),
        "offline_rtf": off.get("rtf"),
        "stream16_audio_s_per_s": cell(rows, "streaming", 16, "audio_s_per_s"),
        "stream16_ttfb_p95_ms": (lambda v: v * 1000 if v is not None else None)(cell(rows, "streaming", 16, "ttfb_p95_s")),
        "stream1_ttfb_p50_ms": (lambda v: v * 1000 if v is not None else None)(cell(rows, "streaming", 1, "ttfb_p50_s")),
        "offline64_audio_s_per_s": cell(rows, "offline", 64, "audio_s_per_s"),
        "non_finite_samples": float(sum(bad)) if bad else None,
    }


# name, key, format, target text, pass rule
ROWS: list[tuple[str, str, str, str, Callable[[float], bool] | None]] = [
    ("LLM decode, 1 request (ms/token, engine)", "decode_ms_per_token_c1", ".2f", "≤ 2", lambda v: v <= 2.0),
    ("LLM decode, 1 request (ms/token, profile p50)", "decode_ms_per_token_profile", ".2f", "≤ 2", lambda v: v <= 2.0),
    ("LLM decode tokens/s, c = 16 against c = 1", "decode_x_c16", ".1f", "≥ 10×", lambda v: v >= 10.0),
    ("Streaming first audio, 1 request (ms, profile)", "stream_first_audio_ms", ".0f", "≤ 200", lambda v: v <= 200.0),
    ("Streaming first audio, 1 request (ms, engine p50)", "stream1_ttfb_p50_ms", ".0f", "≤ 200", lambda v: v <= 200.0),
    ("Streaming first audio, first hop 15 (optional; ms, profile)", "stream_first_audio_hop15_ms", ".0f", "beside the official", None),
    ("Offline RTF, 1 request", "offline_rtf", ".3f", "≤ 0.08", lambda v: v <= 0.08),
    ("16 streaming requests (audio-s/s)", "stream16_audio_s_per_s", ".1f", "≥ 60", lambda v: v >= 60.0),
    ("16 streaming requests, first audio p95 (ms)", "stream16_ttfb_p95_ms", ".0f", "≤ 600", lambda v: v <= 600.0),
    ("64 offline requests (audio-s/s)", "offline64_audio_s_per_s", ".1f", "≥ 150", lambda v: v >= 150.0),
    ("Non-finite samples (fp16 file)", "non_finite_samples", ".0f", "0", lambda v: v == 0),
]


def fmt(v: float | None, spec: str) -> str:
    return "–" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files")
    ap.add_argument("--md")
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    got = {label: measures(a.files, label) for label in LABELS}
    lines = ["| row | target | before | after | after meets it |", "|---|---|---|---|---|"]
    for name, key, spec, target, rule in ROWS:
        after = got["after"][key]
        ok = "–" if after is None or rule is None else ("yes" if rule(after) else "no")
        lines.append(f"| {name} | {target} | {fmt(got['before'][key], spec)} | {fmt(after, spec)} | {ok} |")
    extra = []
    for path in sorted(glob.glob(os.path.join(a.files, "golden-*.txt"))):
        text = read_text(path) or ""
        last = [l for l in text.splitlines() if l.strip()][-3:]
        extra.append(f"- {os.path.basename(path)}: " + " / ".join(last))
    for name in ("trt-rtx.txt", "trt-rtx-fallback.txt"):
        text = read_text(os.path.join(a.files, name))
        if text is not None:
            last = [l for l in text.splitlines() if l.strip()][-3:]
            extra.append(f"- {name}: " + " / ".join(last))
    ort = read_json(os.path.join(a.files, "ort-decode.json"))
    if ort:
        extra.append(
            f"- ONNX Runtime profile of a median decode step: {ort['chosen_run_ms']:.3f} ms = {ort['in_nodes_ms']:.3f} ms in "
            f"{ort['nodes']} nodes + {ort['host_gap_ms']:.3f} ms host gap ({ort['nodes_by_provider']})"
        )
    gpu = read_text(os.path.join(a.files, "gpu.txt"))
    if gpu:
        extra.insert(0, f"- GPU: {gpu.strip()}")
    text = "\n".join(lines + [""] + extra) + "\n"
    print(text)
    if a.md:
        with open(a.md, "w", encoding="utf-8") as f:
            f.write(text)
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(got, f, indent=1)


if __name__ == "__main__":
    main()

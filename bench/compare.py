#!/usr/bin/env python3
"""cosy vs the PyTorch eager reference on the same weights, same text, same number of speech tokens.

One run on one machine: the reference pipeline (`python -m cosy_export reference`, official-layout
folder) and `cosy profile --json` (exported folder) are each run with warm-up and several measured
runs, one after the other, `--rounds` times alternating, so that load from other processes hits
both alike. Medians per stage and end to end, and their ratios (reference / cosy: >1 means cosy is
faster), are printed and written as JSON.

    bench/compare.py --official models/full-random --export models/full-export \\
        --tokens 50 --runs 2 --rounds 2 --out bench/results.json

Both sides force exactly `--tokens` speech tokens (stop ids masked: random weights never stop on
their own) and run with the text frontend off and seed 0; cosy runs on CPU fp32 unless told
otherwise (`--cosy-args`). `--also LABEL=ARGS` (repeatable) adds further cosy settings to every
round, e.g. int8 for the two MatMul-bound stages:

    bench/compare.py --export models/full-export-int8 --rounds 2 --runs 1 --warmup 0 \
        --also "int8=--provider cpu --set stages.dit.precision=int8 --set stages.llm.precision=int8"

`--stream` compares the streaming paths and adds a `first_audio` row: the reference runs the
official streaming loop (`reference --stream --live`: the LLM in a thread, the main thread polling
every 0.1 s and running a chunk once hop + 3 tokens are there, cosyvoice3.md §7.2), cosy runs
`profile --stream` (its `ttfb_ms`). First audio counts from the request's start, frontend included,
on both sides. The official loop's hop grows per model object (its quirk: a second request starts
at hop 100), so each reference run starts from a fresh schedule (hop 25), its best case:

    bench/compare.py --stream --tokens 60 --runs 1 --rounds 2 \
        --also "both-off=--provider cpu --precision fp32 --set engine.prompt_cache=off --set engine.first_audio_priority=off"

The first cosy setting is the one the `cosy ms`/ratio columns show; every `--also` setting gets its
own column and ratio against the reference. An `--also` setting with its own `--model DIR` runs on
that folder instead of `--export` (before/after an exporter change:
`--also "new=--provider cpu --precision fp32 --model models/full-export-new"`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEXT = "The old lighthouse blinked twice before the fog rolled in over the quiet harbour town."
DEFAULT_PROMPT_TEXT = "You are a helpful assistant.<|endofprompt|>Good evening, this recording captures my natural voice."
STAGES = ("frontend", "llm", "flow", "hift", "total")
STREAM_STAGES = (*STAGES, "first_audio")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    print("$ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)


def reference_runs(args: argparse.Namespace, out: Path) -> list[dict[str, float]]:
    cmd = [args.python, "-m", "cosy_export", "reference", str(args.official), "--text", args.text,
           "--prompt-text", args.prompt_text, "--prompt-wav", str(args.prompt_wav),
           "--ignore-stop-until", str(args.tokens), "--runs", str(args.runs), "--warmup", str(args.warmup),
           "--json", str(out)]
    if args.stream:
        cmd += ["--stream", "--live"]
    run(cmd, REPO / "onnx")
    rows = json.loads(out.read_text())["runs"]
    return [{k: v * 1e3 if k in STREAM_STAGES or k == "token2wav" else v for k, v in r.items()} for r in rows]


def cosy_runs(args: argparse.Namespace, out: Path, cosy_args: str) -> tuple[list[dict[str, float]], dict]:
    flags = shlex.split(cosy_args)
    model = [] if "--model" in flags else ["--model", str(args.export)]  # an --also setting may name its own folder
    cmd = [str(args.cosy), *model, *flags, "profile",
           "--prompt-wav", str(args.prompt_wav), "--prompt-text", args.prompt_text, "--no-text-frontend",
           "--min-tokens", str(args.tokens), "--runs", str(args.runs), "--warmup", str(args.warmup),
           "--seed", "0", "--json", str(out), *(["--stream"] if args.stream else []), "--", args.text]
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSY_")}
    run(cmd, REPO, env)
    report = json.loads(out.read_text())
    rows = []
    for r in report["per_run"]:
        st = r["stages"]
        rows.append({"frontend": st["frontend"]["total_ms"], "llm": st["llm"]["total_ms"], "flow": st["flow"]["total_ms"],
                     "hift": st["hift"]["total_ms"], "total": r["total_ms"], "first_audio": r["ttfb_ms"],
                     "speech_tokens": r["speech_tokens"],
                     "audio_s": r["audio_s"], "sub": {k: v["total_ms"] for k, v in st.items()},
                     "calls": {k: v["calls"] for k, v in st.items()}})
    return rows, report


def machine() -> dict[str, str]:
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    facts = {}
    for line in lscpu.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("Model name", "CPU(s)", "Core(s) per socket", "Thread(s) per core", "Socket(s)"):
            facts[key.strip()] = value.strip()
    facts["kernel"] = platform.release()
    return facts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official", type=Path, default=REPO / "models/full-random")
    p.add_argument("--export", type=Path, default=REPO / "models/full-export")
    p.add_argument("--prompt-wav", type=Path, default=REPO / "tests/fixtures/prompt_24k.wav")
    p.add_argument("--prompt-text", default=DEFAULT_PROMPT_TEXT)
    p.add_argument("--text", default=DEFAULT_TEXT)
    p.add_argument("--tokens", type=int, default=50, help="speech tokens both sides decode")
    p.add_argument("--runs", type=int, default=2, help="measured runs per round and side")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="alternate reference/cosy this many times")
    p.add_argument("--python", default=os.environ.get("COSY_PYTHON", str(Path.home() / ".cache/cosy/venv/bin/python")))
    p.add_argument("--cosy", type=Path, default=Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release/cosy")
    p.add_argument("--cosy-args", default="--provider cpu --precision fp32", help="global cosy flags")
    p.add_argument("--also", action="append", default=[], metavar="LABEL=ARGS",
                   help="another cosy setting (global cosy flags) timed in every round; repeatable")
    p.add_argument("--stream", action="store_true",
                   help="compare the streaming paths (the official live loop vs cosy profile --stream), with first audio")
    p.add_argument("--out", type=Path, help="write all runs and the ratios as JSON")
    args = p.parse_args()
    extra: list[tuple[str, str]] = []
    for item in args.also:
        label, sep, flags = item.partition("=")
        if not sep or not label.strip():
            p.error(f"--also {item!r}: expected LABEL=ARGS, e.g. int8=--precision int8")
        extra.append((label.strip(), flags))

    ref: list[dict[str, float]] = []
    cos: list[dict[str, float]] = []
    more: dict[str, list[dict[str, float]]] = {label: [] for label, _ in extra}
    report: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            ref += reference_runs(args, Path(tmp) / f"ref{i}.json")
            rows, report = cosy_runs(args, Path(tmp) / f"cosy{i}.json", args.cosy_args)
            cos += rows
            for j, (label, flags) in enumerate(extra):
                rows, _ = cosy_runs(args, Path(tmp) / f"cosy{i}.{j}.json", flags)
                more[label] += rows

    head = "".join(f" {label + ' ms':>12} {'ratio':>7}" for label in more)
    print(f"\n{'stage':<10} {'reference ms':>13} {'cosy ms':>10} {'ratio ref/cosy':>15}{head}")
    ratios = {}
    more_ratios: dict[str, dict[str, float]] = {label: {} for label in more}
    for s in STREAM_STAGES if args.stream else STAGES:
        r, c = median([x[s] for x in ref]), median([x[s] for x in cos])
        ratios[s] = r / c if c > 0 else float("nan")
        cols = ""
        for label, rows in more.items():
            m = median([x[s] for x in rows])
            more_ratios[label][s] = r / m if m > 0 else float("nan")
            cols += f" {m:>12.1f} {more_ratios[label][s]:>6.2f}x"
        print(f"{s:<10} {r:>13.1f} {c:>10.1f} {ratios[s]:>14.2f}x{cols}")
    tok_r = median([x["speech_tokens"] for x in ref])
    tok_c = median([x["speech_tokens"] for x in cos])
    aud_r = median([x["audio_s"] for x in ref])
    aud_c = median([x["audio_s"] for x in cos])
    print(f"speech tokens: reference {tok_r:.0f}, cosy {tok_c:.0f}; audio: reference {aud_r:.2f} s, cosy {aud_c:.2f} s")
    print(f"RTF: reference {median([x['total'] for x in ref]) / 1e3 / aud_r:.3f}, "
          f"cosy {median([x['total'] for x in cos]) / 1e3 / aud_c:.3f}")
    for label, rows in [("cosy", cos), *more.items()]:
        if not rows:
            continue
        print(f"\n{label} sub-steps (median ms per run over all rounds, calls per run):")
        for k in ("llm.prefill", "llm.decode", "llm.sampling", "flow.front", "flow.dit", "hift.f0", "hift.source",
                  "hift.decode"):
            ms = median([x["sub"].get(k, 0.0) for x in rows])
            calls = median([x["calls"].get(k, 0) for x in rows])
            print(f"  {k:<14} {ms:>10.1f} ms  {calls:>5.0f} calls  {ms / calls if calls else 0:.2f} ms/call")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
                                        "reference_runs": ref, "cosy_runs": cos, "ratios": ratios,
                                        "also_runs": more, "also_ratios": more_ratios,
                                        "cosy_last_report": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Summarise ONNX Runtime profiles (`runtime.ort_profile`, written when each session closes).

For one stage's profile: its runs grouped by the shape class a run belongs to (the LLM's decode
steps are the many short runs after each prefill), and for the median decode-sized run: its wall
time, the time inside its nodes, the host gap between them (the run's time not spent in any node:
scheduling, allocation, copies and waiting), the node count (on the CUDA provider a node's time is
the host's launch time, so many cheap nodes is the launch-bound signature) and the ops that took
the most time.

    python3 bench/ort_profile.py PROFILE.json [--top 12] [--json OUT.json]
    python3 bench/ort_profile.py --stage llm DIR_OR_PREFIX   # the newest file of that stage

Standard library only (runs on a GPU host without numpy).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
from collections import defaultdict
from typing import Any


def load(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    # ONNX Runtime writes a JSON array of trace events (Chrome trace format).
    return data if isinstance(data, list) else data.get("traceEvents", [])


def runs_with_nodes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each `model_run` with the node events that fall inside it."""
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    nodes = sorted(
        (e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")),
        key=lambda e: e["ts"],
    )
    out = []
    i = 0
    for run in sorted(runs, key=lambda e: e["ts"]):
        start, end = run["ts"], run["ts"] + run["dur"]
        inside = []
        while i < len(nodes) and nodes[i]["ts"] < start:
            i += 1
        j = i
        while j < len(nodes) and nodes[j]["ts"] < end:
            inside.append(nodes[j])
            j += 1
        i = j
        node_us = sum(n["dur"] for n in inside)
        out.append({"ts": start, "dur_us": run["dur"], "node_us": node_us, "nodes": inside})
    return out


def summarise(path: str, top: int) -> dict[str, Any]:
    runs = runs_with_nodes(load(path))
    if not runs:
        return {"file": path, "runs": 0}
    # Decode steps are the common case: the run durations' lower half is the steps, the prefills
    # (and any warm-up) are the long ones. Take the median of the runs at or below the overall median.
    durs = sorted(r["dur_us"] for r in runs)
    cut = durs[len(durs) // 2]
    steps = [r for r in runs if r["dur_us"] <= cut]
    step_durs = [r["dur_us"] for r in steps]
    median = statistics.median(step_durs)
    chosen = min(steps, key=lambda r: abs(r["dur_us"] - median))
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    providers: dict[str, int] = defaultdict(int)
    for n in chosen["nodes"]:
        args = n.get("args", {})
        op = args.get("op_name", "?")
        by_op[op][0] += n["dur"]
        by_op[op][1] += 1
        providers[args.get("provider", "?")] += 1
    ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "file": path,
        "runs": len(runs),
        "step_runs": len(steps),
        "step_median_ms": median / 1000,
        "step_p90_ms": sorted(step_durs)[int(0.9 * (len(step_durs) - 1))] / 1000,
        "chosen_run_ms": chosen["dur_us"] / 1000,
        "in_nodes_ms": chosen["node_us"] / 1000,
        "host_gap_ms": (chosen["dur_us"] - chosen["node_us"]) / 1000,
        "nodes": len(chosen["nodes"]),
        "nodes_by_provider": dict(providers),
        "top_ops": [{"op": op, "ms": us / 1000, "count": int(count)} for op, (us, count) in ops],
    }


def newest(stage: str, where: str) -> str:
    pattern = os.path.join(where, f"*-{stage}_*.json") if os.path.isdir(where) else f"{where}-{stage}_*.json"
    files = sorted(glob.glob(pattern), key=os.path.getmtime)
    if not files:
        sys.exit(f"ort_profile.py: no profile of stage {stage!r} matches {pattern} (set runtime.ort_profile)")
    return files[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a profile JSON, or with --stage a folder or the runtime.ort_profile prefix")
    ap.add_argument("--stage", help="pick the newest profile of this stage (llm, llm_step, dit, hift_decode, ...)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    path = newest(a.stage, a.path) if a.stage else a.path
    s = summarise(path, a.top)
    if s["runs"] == 0:
        sys.exit(f"ort_profile.py: {path} has no model_run events")
    print(f"{os.path.basename(path)}: {s['runs']} runs; step-sized runs {s['step_runs']}, median {s['step_median_ms']:.3f} ms, "
          f"p90 {s['step_p90_ms']:.3f} ms")
    print(f"one median step: {s['chosen_run_ms']:.3f} ms = {s['in_nodes_ms']:.3f} ms in {s['nodes']} nodes "
          f"+ {s['host_gap_ms']:.3f} ms host gap; nodes by provider {s['nodes_by_provider']}")
    print("| op | ms | nodes |\n|---|---|---|")
    for o in s["top_ops"]:
        print(f"| {o['op']} | {o['ms']:.3f} | {o['count']} |")
    if a.json_out:
        with open(a.json_out, "w", encoding="utf-8") as f:
            json.dump(s, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""HiFT alone: the PyTorch eager reference vs `hift_decode` graphs under ONNX Runtime (CPU).

Same mel for every side (`--frames` mel frames, 100 = 50 speech tokens), the f0 and NSF source
computed once by the reference. Rounds alternate every side so that load from other processes
hits all alike; medians (and minima) are printed with the ratio first side / side (> 1: faster
than the first side, PyTorch's decode unless `--no-torch`), and the median CPU time of the
process during each call (all threads; with `--no-spin` ONNX Runtime's idle threads sleep, so it
measures work done, which load from other processes disturbs much less than wall time).
`--threads N` sets both torch's and ONNX Runtime's thread count (1 gives the least load-sensitive
comparison). `--profile` adds ONNX Runtime's per-node profile of each graph, summed per op type
and per node.

    bench/hift.py --official models/full-random --graph models/full-export/hift_decode.fp32.onnx \\
        --frames 100 --rounds 7 [--graph other.onnx ...] [--threads 1] [--no-spin] [--profile]

Reference columns: `torch decode` is `HiftGenerator.decode` with torch.stft/istft and nearest
up-sampling, the official form (what the reference pipeline times inside `hift`), `torch
f0+source` the float64 f0 predictor and the NSF source, `torch hift` the whole `inference` call
as bench/compare.py's reference `hift` stage.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "onnx"))


def ort_session(path: Path, threads: int, profile: bool, tag: str, no_spin: bool = False):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    if threads:
        opts.intra_op_num_threads = threads
    if no_spin:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        opts.enable_profiling = True
        opts.profile_file_prefix = f"/tmp/hift_profile_{tag}"
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def summarise_profile(path: str, runs: int, top: int) -> None:
    events = json.loads(Path(path).read_text())
    by_op: collections.Counter[str] = collections.Counter()
    by_node: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            op = e["args"]["op_name"]
            by_op[op] += e["dur"]
            by_node[e["name"][: -len("_kernel_time")]] += e["dur"]
            count[op] += 1
    total = sum(by_op.values())
    print(f"  nodes total {total / runs / 1e3:.1f} ms/run")
    for op, d in by_op.most_common():
        if d / total >= 0.001:
            print(f"    {op:22s} {d / runs / 1e3:8.1f} ms {100 * d / total:5.1f} %  ({count[op] // runs} nodes)")
    print(f"  top {top} nodes")
    for name, d in by_node.most_common(top):
        print(f"    {d / runs / 1e3:8.2f} ms  {name}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--official", type=Path, required=True, help="official-layout folder (hift.pt, cosyvoice3.yaml)")
    p.add_argument("--graph", type=Path, action="append", default=[], help="hift_decode graph (repeatable)")
    p.add_argument("--frames", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=0,
                   help="threads for both sides: torch.set_num_threads and ORT intra-op threads (0: their defaults)")
    p.add_argument("--no-torch", action="store_true", help="time the graphs only")
    p.add_argument("--no-spin", action="store_true",
                   help="ORT intra-op threads sleep instead of spinning (makes the CPU-time column a measure "
                        "of work done on a loaded machine)")
    p.add_argument("--profile", action="store_true", help="per-node ORT profile (separate sessions)")
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args()

    import torch
    import torch.nn.functional as F

    from cosy_export.hift import HiftConfig, load_hift
    from cosy_export.noise import sine_noise, sine_noise_offset
    from cosy_export.yamlcfg import load_model_config

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg_all = load_model_config(args.official)
    cfg = HiftConfig.from_yaml(cfg_all.hift_raw)
    model = load_hift(args.official, cfg)
    noise = sine_noise(sine_noise_offset(cfg_all), cfg.samples_per_frame * args.frames).unsqueeze(0)
    torch.manual_seed(0)
    mel = torch.randn(1, cfg.in_channels, args.frames) * 2 - 4  # roughly log-mel scaled
    look = cfg.conv_pre_look_right
    with torch.inference_mode():
        f0 = model.predict_f0(mel, True).float()
        src = model.source(f0, noise)
        mel_in = F.pad(mel, (0, look))
        ref = model.decode(mel_in, src, dft="fft").numpy()
    feeds = {"mel": mel_in.numpy(), "source": src.numpy()}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; frames {args.frames}; "
          f"mel {list(mel_in.shape)}, source {list(src.shape)}")

    sides: dict[str, object] = {}
    if not args.no_torch:
        def torch_decode() -> None:
            with torch.inference_mode():
                model.decode(mel_in, src, dft="fft")

        def torch_f0_source() -> None:
            with torch.inference_mode():
                model.source(model.predict_f0(mel, True).float(), noise)

        def torch_hift() -> None:
            model.inference(mel, noise, finalize=True)

        sides = {"torch decode": torch_decode, "torch f0+source": torch_f0_source, "torch hift": torch_hift}
    sessions = {}
    for i, g in enumerate(args.graph):
        label = f"ort {g.parent.name}/{g.name}" if len(args.graph) > 1 else f"ort {g.name}"
        sess = ort_session(g, args.threads, False, str(i), args.no_spin)
        out = sess.run(None, feeds)[0]
        err = float(np.abs(out - ref).max())
        print(f"{label}: max |graph - torch decode| {err:.3e} (rel {err / float(np.abs(ref).max()):.2e})")
        sessions[label] = sess
        sides[label] = (lambda s=sess: s.run(None, feeds))

    for fn in sides.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {k: [] for k in sides}
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(args.rounds):
        for k, fn in sides.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[k].append(1e3 * (time.perf_counter() - t0))
            cpu[k].append(1e3 * (time.process_time() - c0))
    first = next(iter(times))
    ref_ms = statistics.median(times[first])
    print(f"\n{'side':44s} {'median ms':>10s} {'min ms':>8s} {first + ' / side':>24s} {'CPU ms (median)':>16s}")
    for k, ts in times.items():
        med = statistics.median(ts)
        print(f"{k:44s} {med:10.1f} {min(ts):8.1f} {ref_ms / med:23.2f}x {statistics.median(cpu[k]):16.1f}")

    if args.profile:
        for i, g in enumerate(args.graph):
            sess = ort_session(g, args.threads, True, str(i), args.no_spin)
            runs = 3
            for _ in range(runs):
                sess.run(None, feeds)
            print(f"\nprofile {g} ({runs} runs, first included)")
            summarise_profile(sess.end_profiling(), runs, args.top)


if __name__ == "__main__":
    main()

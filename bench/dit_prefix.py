"""First-chunk DiT cost with and without the prompt-prefix cache, one graph, interleaved.

Times the `dit` graph of an exported folder as a streaming first chunk runs it (2 CFG rows,
block-causal, prompt + first hop frames): the plain call over every frame, and the call that
continues after the cached prompt frames (docs/model-format.md "dit prompt cache"). The two are
run alternately, so load from other processes hits both alike; the ratio of medians is what the
cache saves on the first chunk's DiT work (10 such calls per chunk).

    python bench/dit_prefix.py models/full-export/dit.fp32.onnx --prompt-frames 150 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("graph")
    ap.add_argument("--prompt-frames", type=int, default=150, help="150 = the bundled 3 s prompt, 500 = 10 s")
    ap.add_argument("--hop-frames", type=int, default=50, help="the first chunk's new frames (25 tokens)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = a.threads
    sess = ort.InferenceSession(a.graph, opts, providers=["CPUExecutionProvider"])
    shapes = {i.name: i.shape for i in sess.get_inputs()}
    depth, inner = shapes["cache_k"][0], shapes["cache_k"][3]
    ctx, dim = shapes["cache_conv1"][1], shapes["cache_conv1"][2]
    # padded prompt: the first chunk ends on a 50-frame boundary (prompt_token_pad)
    total = -(-a.prompt_frames // 50) * 50 + a.hop_frames
    cached = (a.prompt_frames - 6) // 50 * 50
    rng = np.random.default_rng(0)
    feed = {
        "x": rng.standard_normal((2, 80, total), dtype=np.float32),
        "mask": np.ones((2, 1, total), np.float32),
        "mu": rng.standard_normal((2, 80, total), dtype=np.float32),
        "t": np.array([0.3, 0.3], np.float32),
        "spks": rng.standard_normal((2, 80), dtype=np.float32),
        "cond": rng.standard_normal((2, 80, total), dtype=np.float32),
        "block_frames": np.array([50], np.int64),
    }
    empty = np.zeros((depth, 2, 0, inner), np.float32)
    zeros = np.zeros((2, ctx, dim), np.float32)
    plain = feed | {"cache_k": empty, "cache_v": empty, "cache_conv1": zeros, "cache_conv2": zeros,
                    "record_frames": np.array([cached], np.int64)}
    full, k, v, c1, c2 = sess.run(None, plain)
    plain["record_frames"] = np.array([0], np.int64)
    rest = {n: (x[:, :, cached:] if x.ndim == 3 else x) for n, x in feed.items()}
    cont = rest | {"cache_k": k, "cache_v": v, "cache_conv1": c1, "cache_conv2": c2, "record_frames": np.array([0], np.int64)}
    out = sess.run(None, cont)[0]
    err = float(np.abs(out - full[:, :, cached:]).max())
    # What storing the cache in fp16 (half the bytes) would cost in exactness: one call's velocity.
    half = cont | {n: cont[n].astype(np.float16).astype(np.float32) for n in ("cache_k", "cache_v", "cache_conv1", "cache_conv2")}
    err16 = float(np.abs(sess.run(None, half)[0] - full[:, :, cached:]).max())
    times: dict[str, list[float]] = {"plain": [], "cached": []}
    for _ in range(a.rounds):
        for name, f in (("plain", plain), ("cached", cont)):
            t0 = time.perf_counter()
            sess.run(["estimator_out"], f)
            times[name].append(time.perf_counter() - t0)
    p, c = statistics.median(times["plain"]), statistics.median(times["cached"])
    print(f"{a.graph}: prompt {a.prompt_frames} frames, call {total} frames, {cached} cached "
          f"({k.nbytes * 2 * 10 / 1e6:.0f} MB per voice over 10 steps): plain {p * 1e3:.0f} ms, "
          f"cached {c * 1e3:.0f} ms, ratio {c / p:.2f} (max |diff| {err:.1e}; with the cache stored as fp16 {err16:.1e})")


if __name__ == "__main__":
    main()

"""Command line: `python -m cosy_export {export,random,fixture,reference} ...`."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .checkpoint import CheckpointError
from .yamlcfg import ConfigError

# The bundled test fixture: random tiny weights, seed 0, with the official sampling settings.
FIXTURE_SEED = 0
FIXTURE_NOISE_FRAMES = 1500  # 30 s of flow noise; enough for every test, keeps the folder small


def _export(args: argparse.Namespace) -> int:
    from .export import ExportOptions, export_model

    opts = ExportOptions(precisions=args.precisions.split(","), noise_frames=args.noise_frames,
                         sparse_text_embedding=args.sparse_text_embedding,
                         text_normalization=not args.no_text_normalization)
    start = time.perf_counter()
    export_model(args.src, args.dst, opts)
    print(f"exported {args.src} -> {args.dst} in {time.perf_counter() - start:.1f} s")
    return 0


def _llm_step(args: argparse.Namespace) -> int:
    from .export import add_llm_step

    start = time.perf_counter()
    add_llm_step(args.src, args.dst)
    print(f"added llm_step to {args.dst} in {time.perf_counter() - start:.1f} s")
    return 0


def _random(args: argparse.Namespace) -> int:
    from .random_model import write_random_model

    start = time.perf_counter()
    write_random_model(args.out, size=args.size, seed=args.seed, greedy=args.greedy)
    print(f"wrote random {args.size} model (seed {args.seed}) to {args.out} in {time.perf_counter() - start:.1f} s")
    return 0


def make_fixture(out: Path, seed: int = FIXTURE_SEED) -> None:
    """Random tiny official-layout folder -> exported folder at `out` (bit-for-bit reproducible)."""
    from .export import ExportOptions, export_model
    from .random_model import write_random_model

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "tiny-random"
        write_random_model(src, size="tiny", seed=seed)
        export_model(src, out, ExportOptions(noise_frames=FIXTURE_NOISE_FRAMES, sparse_text_embedding=True,
                                             text_normalization=False, random={"size": "tiny", "seed": seed}))


def _fixture(args: argparse.Namespace) -> int:
    from .prompt_audio import write_prompt

    make_fixture(Path(args.out), args.seed)
    write_prompt(Path(args.out).parent / "prompt_24k.wav")
    total = sum(p.stat().st_size for p in Path(args.out).iterdir())
    print(f"fixture written to {args.out} ({total / 1e6:.1f} MB)")
    return 0


def _reference(args: argparse.Namespace) -> int:
    import torch

    from .reference import ReferenceModel, Request, synthesize, write_dump

    model = ReferenceModel.load(args.model)
    req = Request(tts_text=args.text, prompt_text=args.prompt_text, prompt_wav=Path(args.prompt_wav),
                  stream=args.stream, seed=args.seed, ignore_stop_until=args.ignore_stop_until, live=args.live)
    if args.live and not args.stream:
        print("--live times the streaming loop: add --stream", file=sys.stderr)
        return 2
    timings: dict[str, float] = {}
    runs: list[dict[str, float]] = []
    for i in range(args.warmup + args.runs):
        timings = {}
        t0 = time.perf_counter()
        dump = synthesize(model, req, timings)
        timings["total"] = time.perf_counter() - t0
        timings["speech_tokens"] = float(len(dump["llm_token_raw"]))
        timings["audio_s"] = float(dump["waveform"].shape[0]) / 24000.0
        if i >= args.warmup:
            runs.append(timings)
    if args.json:
        import json

        Path(args.json).write_text(json.dumps({"torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                                               "runs": runs}, indent=1))
    if args.dump:
        write_dump(dump, args.dump)
    if args.output:
        from .wavio import write_wav_pcm16

        write_wav_pcm16(args.output, dump["waveform"], 24000)
    print(" ".join(f"{k}={v:.3f}s" for k, v in timings.items() if k not in ("speech_tokens", "audio_s")))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cosy_export", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    e = sub.add_parser("export", help="official checkpoint folder -> exported model folder")
    e.add_argument("src", type=Path)
    e.add_argument("dst", type=Path)
    e.add_argument("--precisions", default="fp32,fp16",
                   help="comma list of fp32, fp16, int8 (default fp32,fp16; int8 = dynamic int8 MatMuls of llm and dit)")
    e.add_argument("--noise-frames", type=int, default=15000, help="flow-noise columns to keep (15000 = 300 s)")
    e.add_argument("--sparse-text-embedding", action="store_true",
                   help="keep only text-embedding rows the tokenizer can produce (small test folders)")
    e.add_argument("--no-text-normalization", action="store_true",
                   help="leave out the wetext TN grammars (tn/); the runtime then reads numbers as written")
    e.set_defaults(fn=_export)

    ls = sub.add_parser("llm-step", help="add the llm_step graph to a folder exported before it (engine.llm_kv)")
    ls.add_argument("src", type=Path, help="the checkpoint folder the export was made from")
    ls.add_argument("dst", type=Path, help="the exported model folder")
    ls.set_defaults(fn=_llm_step)

    r = sub.add_parser("random", help="write a random-weight model in the official layout")
    r.add_argument("out", type=Path)
    r.add_argument("--size", choices=["tiny", "full"], default="tiny")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--greedy", action="store_true", help="top_k 1 / tau_r 2.0 sampling in the yaml (deterministic)")
    r.set_defaults(fn=_random)

    f = sub.add_parser("fixture", help="regenerate the bundled tests/fixtures/tiny folder")
    f.add_argument("out", type=Path, nargs="?", default=Path(__file__).resolve().parents[2] / "tests/fixtures/tiny")
    f.add_argument("--seed", type=int, default=FIXTURE_SEED)
    f.set_defaults(fn=_fixture)

    ref = sub.add_parser("reference", help="run the PyTorch reference pipeline on an official-layout folder")
    ref.add_argument("model", type=Path)
    ref.add_argument("--text", required=True)
    ref.add_argument("--prompt-text", required=True)
    ref.add_argument("--prompt-wav", required=True)
    ref.add_argument("--stream", action="store_true")
    ref.add_argument("--live", action="store_true",
                     help="with --stream: the official streaming loop (LLM in a thread, chunks polled every 0.1 s), "
                          "timing first audio as users of the official code wait for it")
    ref.add_argument("--seed", type=int, default=0)
    ref.add_argument("--ignore-stop-until", type=int, default=None, help="benchmark/test only, not the official rule: decode exactly N tokens (stop ids masked; cosy --min-tokens)")
    ref.add_argument("--runs", type=int, default=1, help="measured runs (timings of each go to --json)")
    ref.add_argument("--warmup", type=int, default=0, help="unmeasured runs first")
    ref.add_argument("--json", type=Path, help="write per-run stage timings (seconds) as JSON")
    ref.add_argument("--dump", type=Path)
    ref.add_argument("-o", "--output", type=Path)
    ref.set_defaults(fn=_reference)

    args = p.parse_args(argv)
    try:
        return args.fn(args)
    except (CheckpointError, ConfigError, FileNotFoundError, ValueError) as err:
        print(f"cosy_export: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

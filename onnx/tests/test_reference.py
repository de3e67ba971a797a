"""The PyTorch reference pipeline reproduces the intermediates the official code recorded.

Runs every golden case of ../shared/reference through `cosy_export.reference` on the tiny model in
the official layout, dumps with the golden names and scores the dump with the reference set's own
compare.py (the same script the Rust runtime is checked with).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cosy_export.reference import (
    ReferenceModel, Request, nucleus_candidates, prune_silent, ras_sample, run_case, stream_schedule, synthesize,
)

CASES = ["en", "zh", "num", "p16k", "stream"]


@pytest.fixture(scope="module")
def reference_model(tiny_official: Path) -> ReferenceModel:
    return ReferenceModel.load(tiny_official)


def test_all_golden_cases_pass_compare_py(reference_model: ReferenceModel, reference_dir: Path, tmp_path: Path) -> None:
    for case in CASES:
        run_case(reference_model, reference_dir / "golden" / case, reference_dir, tmp_path / case)
    proc = subprocess.run(
        [sys.executable, str(reference_dir / "compare.py"), str(tmp_path), "--strict"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("PASS: 5/5")


def test_stream_schedule_matches_official_calls(golden: Path) -> None:
    import json

    meta = json.loads((golden / "stream" / "meta.json").read_text())
    calls = stream_schedule(meta["n_speech_token"], meta["n_prompt_speech_token"])
    expected = [(c["token_len"], c["finalize"]) for c in meta["flow_calls"]]
    assert calls == expected


def test_silent_pruning_keeps_runs_of_five_and_drops_beyond() -> None:
    assert prune_silent([1] * 5 + [7]) == [1] * 5 + [7]
    assert prune_silent([1, 2, 28, 29, 55, 248, 494, 9, 1]) == [1, 2, 28, 29, 55, 9, 1]


def test_nucleus_includes_crossing_token_and_ras_masks_repeats() -> None:
    logp = torch.log(torch.tensor([0.5, 0.35, 0.1, 0.05]))
    ids, _ = nucleus_candidates(logp, top_p=0.8, top_k=25)
    assert ids.tolist() == [0, 1]  # 0.5 < 0.8 keeps going; 0.85 crosses and is included
    gen = torch.Generator().manual_seed(0)
    sampling = {"top_p": 0.8, "top_k": 1, "win_size": 10, "tau_r": 0.1}
    # id 0 is the only nucleus candidate and was just emitted: RAS must redraw without it.
    draws = {ras_sample(logp.clone(), [0], sampling, gen) for _ in range(50)}
    assert 0 not in draws and draws <= {1, 2, 3}


def test_dump_dtypes_follow_the_contract(reference_model: ReferenceModel, reference_dir: Path, tmp_path: Path) -> None:
    run_case(reference_model, reference_dir / "golden" / "en", reference_dir, tmp_path)
    assert np.load(tmp_path / "llm_token_raw.npy").dtype == np.int32
    assert np.load(tmp_path / "waveform.npy").dtype == np.float32
    assert np.load(tmp_path / "whisper_mel.npy").shape[0] == 128


def test_live_streaming_loop_gives_the_same_speech_and_times_first_audio(reference_model: ReferenceModel,
                                                                        reference_dir: Path) -> None:
    """`--live` (the official `tts()` loop: LLM thread, 0.1 s polling, bench/compare.py --stream)
    makes the same chunks from the same tokens as the chunks run after the LLM; it only adds the
    time of first audio. Audio within 1e-4, not bit-equal: the LLM thread runs beside the chunks
    on torch's shared intra-op pool, which may split a reduction differently."""
    import dataclasses
    import json

    case = reference_dir / "golden" / "stream"
    meta = json.loads((case / "meta.json").read_text())
    req = Request(tts_text=meta["tts_text"], prompt_text=meta["prompt_text"],
                  prompt_wav=reference_dir / meta["prompt_wav"], stream=True)
    after = synthesize(reference_model, req)
    timings: dict[str, float] = {}
    live = synthesize(reference_model, dataclasses.replace(req, live=True), timings)
    for name in ("llm_token_raw", "speech_token", "chunk_samples"):
        np.testing.assert_array_equal(live[name], after[name], err_msg=name)
    assert len(live["chunk_samples"]) == len(meta["flow_calls"]) > 1
    np.testing.assert_allclose(live["waveform"], after["waveform"], atol=1e-4)
    assert 0 < timings["first_audio"] and timings["frontend"] < timings["first_audio"]

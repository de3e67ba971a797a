"""LLM: golden greedy tokens with our own Qwen2, and the ONNX graph against the torch module."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from cosy_export.checkpoint import CheckpointError
from cosy_export.llm import CosyLlm, export_llm, export_llm_step, greedy_decode, llm_io_names, llm_step_io_names, load_llm

CASES = ["en", "zh", "num", "p16k"]


@pytest.fixture(scope="module")
def llm(tiny_official: Path) -> CosyLlm:
    torch.set_num_threads(1)
    return load_llm(tiny_official)


def _case(golden: Path, case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    d = golden / case
    return (
        np.load(d / "prompt_text_token.npy"),
        np.load(d / "text_token.npy"),
        np.load(d / "prompt_speech_token.npy"),
        np.load(d / "llm_token_raw.npy")[0],
    )


@pytest.mark.parametrize("case", CASES)
def test_greedy_matches_golden(llm: CosyLlm, golden: Path, case: str) -> None:
    prompt_text, text, prompt_speech, expected = _case(golden, case)
    lm_input = llm.build_lm_input(torch.from_numpy(np.concatenate([prompt_text, text], 1)), torch.from_numpy(prompt_speech))
    assert lm_input.shape == (1, 1 + prompt_text.shape[1] + text.shape[1] + 1 + prompt_speech.shape[1], 16)
    tokens = greedy_decode(llm, lm_input, text.shape[1])
    # discrete argmax decisions: on these cases the top log-prob leads the runner-up by >= 6.8e-3 at every
    # step, thousands of times the float differences between implementations or CPUs (~1e-6)
    assert tokens == expected.tolist()
    meta = json.loads((golden / case / "meta.json").read_text())
    assert len(tokens) == meta["n_llm_token"]


def test_lm_input_layout(llm: CosyLlm) -> None:
    x = llm.build_lm_input(torch.tensor([[5, 151646]]), torch.tensor([[7]]))
    # Exact on every CPU: the input rows are copies of table rows (a gather moves bits, no arithmetic).
    sp = llm.speech_embedding.weight
    torch.testing.assert_close(x[0, 0], sp[6561], rtol=0, atol=0)  # exact: a copy of a table row, no arithmetic
    torch.testing.assert_close(x[0, 2], llm.backbone.embed_tokens.weight[151646], rtol=0, atol=0)  # exact: a copy of a table row, no arithmetic
    torch.testing.assert_close(x[0, 3], sp[6563], rtol=0, atol=0)  # exact: a copy of a table row, no arithmetic
    torch.testing.assert_close(x[0, 4], sp[7], rtol=0, atol=0)  # exact: a copy of a table row, no arithmetic


def test_incremental_equals_full_prefill(llm: CosyLlm) -> None:
    torch.manual_seed(0)
    x = torch.randn(1, 9, 16)
    full, _ = llm.forward_step(x, llm.empty_cache())
    _, cache = llm.forward_step(x[:, :5], llm.empty_cache())
    _, cache = llm.forward_step(x[:, 5:8], cache)
    last, cache = llm.forward_step(x[:, 8:], cache)
    assert cache[0][0].shape == (1, 2, 9, 4)
    torch.testing.assert_close(last, full, rtol=1e-5, atol=1e-5)


def test_strict_load_errors(tiny_official: Path, tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "CosyVoice-BlankEN").mkdir()
    shutil.copy(tiny_official / "CosyVoice-BlankEN" / "config.json", model / "CosyVoice-BlankEN")
    shutil.copy(tiny_official / "cosyvoice3.yaml", model)
    sd = torch.load(tiny_official / "llm.pt", weights_only=True)
    del sd["llm.model.model.layers.1.mlp.up_proj.weight"]
    torch.save(sd, model / "llm.pt")
    with pytest.raises(CheckpointError, match=r"llm\.pt: missing key 'llm\.model\.model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_llm(model)
    qwen = json.loads((model / "CosyVoice-BlankEN" / "config.json").read_text())
    qwen["num_key_value_heads"] = 4
    (model / "CosyVoice-BlankEN" / "config.json").write_text(json.dumps(qwen))
    with pytest.raises(CheckpointError, match=r"num_key_value_heads \* head_dim is 16 in the config but 8"):
        load_llm(model)


def _ort_step(sess: ort.InferenceSession, embeds: np.ndarray, cache: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """One unpadded batch-1 step: mask all ones, positions past..past+seq-1."""
    past, seq = cache[0].shape[2], embeds.shape[1]
    mask = np.ones((1, past + seq), np.int64)
    positions = (np.arange(seq, dtype=np.int64) + past)[None, :]
    names = [i.name for i in sess.get_inputs()]
    feeds = dict(zip(names, [embeds, mask, positions, *cache]))
    outs = sess.run(None, feeds)
    return outs[0], outs[1:]


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def test_onnx_matches_torch(llm: CosyLlm, golden: Path, tmp_path: Path) -> None:
    path = tmp_path / "llm.fp32.onnx"
    entry = export_llm(llm, path)
    in_names, out_names = llm_io_names(2)
    assert [i["name"] for i in entry["inputs"]] == in_names
    assert [o["name"] for o in entry["outputs"]] == out_names
    proto = onnx.load(str(path))
    assert [i.name for i in proto.graph.input] == in_names
    assert [o.name for o in proto.graph.output] == out_names
    assert any(op.version == 17 for op in proto.opset_import if op.domain in ("", "ai.onnx"))

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])

    prompt_text, text, prompt_speech, expected = _case(golden, "en")
    lm_input = llm.build_lm_input(torch.from_numpy(np.concatenate([prompt_text, text], 1)), torch.from_numpy(prompt_speech))
    # prefill (past = 0) and a few decode steps, logits compared step by step
    cache_t = llm.empty_cache()
    cache_o = [t.numpy() for kv in cache_t for t in kv]
    x = lm_input
    with torch.no_grad():
        for step in range(4):
            logits_t, cache_t = llm.forward_step(x, cache_t)
            logits_o, cache_o = _ort_step(sess, x.numpy(), cache_o)
            assert logits_o.shape == (1, 6761)
            err = _rel(logits_o, logits_t.numpy())
            print(f"llm onnx step {step}: max rel err {err:.2e}")
            assert err <= 1e-4, step
            assert cache_o[0].shape == (1, 2, lm_input.shape[1] + step, 4)
            x = llm.speech_embedding.weight[int(logits_t.argmax())].reshape(1, 1, -1)

    # the ONNX graph alone reproduces the golden greedy tokens
    n_text = text.shape[1]
    cache = [np.zeros((1, 2, 0, 4), np.float32) for _ in range(4)]
    table = llm.speech_embedding.weight.detach().numpy()
    x_np = lm_input.numpy()
    tokens: list[int] = []
    for i in range(20 * n_text):
        logits, cache = _ort_step(sess, x_np, cache)
        logp = torch.from_numpy(logits[0]).log_softmax(-1)
        if i < 2 * n_text:
            logp[6561] = float("-inf")
        top = int(logp.argmax())
        if 6561 <= top < 6761:
            break
        tokens.append(top)
        x_np = table[top].reshape(1, 1, -1)
    assert tokens == expected.tolist()  # argmax margins as in test_greedy_matches_golden


def test_batched_rows_equal_solo(llm: CosyLlm, tmp_path: Path) -> None:
    """Three sequences of different lengths decoded together in the padded-KV layout (left
    padding, attention_mask, position_ids) give each row's solo logits, step after step, in
    torch and in the exported graph; the row that joins late is merged into the cache."""
    path = tmp_path / "llm.fp32.onnx"
    entry = export_llm(llm, path)
    assert entry["batching"] == "padded_kv"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    torch.manual_seed(1)
    lengths = [7, 3, 11]
    prompts = [torch.randn(1, n, 16) for n in lengths]
    steps = [torch.randn(1, 1, 16) for _ in range(5)]
    with torch.no_grad():
        # solo: every row alone
        solo: list[list[np.ndarray]] = []
        for p in prompts:
            logits, cache = llm.forward_step(p, llm.empty_cache())
            row = [logits.numpy()]
            for x in steps:
                logits, cache = llm.forward_step(x, cache)
                row.append(logits.numpy())
            solo.append(row)
        # batched: prefill each row alone, then left-pad into one cache and decode together
        caches, firsts = [], []
        for i, p in enumerate(prompts):
            logits, cache = _ort_step(sess, p.numpy(), [np.zeros((1, 2, 0, 4), np.float32)] * 4)
            assert _rel(logits, solo[i][0]) <= 1e-4
            caches.append(cache)
        width = max(lengths)
        merged = [np.zeros((3, 2, width, 4), np.float32) for _ in range(4)]
        mask = np.zeros((3, width), np.int64)
        for i, n in enumerate(lengths):
            mask[i, width - n:] = 1
            for layer in range(4):
                merged[layer][i, :, width - n:] = caches[i][layer][0]
        positions = np.array(lengths, np.int64)[:, None]
        for k, x in enumerate(steps):
            mask = np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)
            embeds = np.concatenate([x.numpy()] * 3, axis=0)
            outs = sess.run(None, dict(zip(names, [embeds, mask, positions, *merged])))
            assert outs[0].shape == (3, 6761)
            merged = outs[1:]
            positions = positions + 1
            for i in range(3):
                err = _rel(outs[0][i : i + 1], solo[i][k + 1])
                assert err <= 1e-4, (i, k, err)
        # torch's own batched forward agrees with the graph's rows
        t_logits, _ = llm.forward_batched(
            torch.from_numpy(np.concatenate([steps[0].numpy()] * 3)),
            torch.from_numpy(mask[:, : width + 1]),
            torch.tensor(lengths)[:, None],
            [(torch.from_numpy(np.zeros((3, 2, width, 4), np.float32)),) * 2 for _ in range(2)],
        )
        assert torch.isfinite(t_logits).all()  # fully padded keys still attend to themselves


class _SlotRunner:
    """Runs the `llm_step` graph with its cache buffers bound in place: each `cache_out.*`
    output is bound to the very OrtValue of its `cache.*` input (the runtime's binding)."""

    def __init__(self, path: Path, num_slots: int, max_positions: int) -> None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        self.sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.in_names, self.out_names = llm_step_io_names(2)
        # NaN everywhere: a column the graph should not read would poison the logits.
        self.buffers = [ort.OrtValue.ortvalue_from_numpy(np.full((num_slots, max_positions, 2, 4), np.nan, np.float32)) for _ in range(4)]
        self.addresses = [b.data_ptr() for b in self.buffers]

    def run(self, embeds: np.ndarray, slots: list[int], start: list[int]) -> np.ndarray:
        io = self.sess.io_binding()
        io.bind_cpu_input("inputs_embeds", np.ascontiguousarray(embeds, np.float32))
        io.bind_cpu_input("slots", np.array(slots, np.int64))
        io.bind_cpu_input("start", np.array(start, np.int64))
        for name_in, name_out, buf in zip(self.in_names[3:], self.out_names[1:], self.buffers):
            io.bind_ortvalue_input(name_in, buf)
            io.bind_ortvalue_output(name_out, buf)
        io.bind_output("logits")
        self.sess.run_with_iobinding(io)
        outs = io.get_outputs()
        # in place: ONNX Runtime handed back the bound buffers, not copies
        assert [o.data_ptr() for o in outs[:4]] == self.addresses
        return outs[4].numpy()


def _greedy_pick(logits: np.ndarray) -> int:
    return int(np.argmax(logits))


def test_llm_step_matches_llm(llm: CosyLlm, golden: Path, tmp_path: Path) -> None:
    """The slot graph `llm_step` with its cache bound in place gives the `llm` graph's logits
    and greedy tokens: one row alone (the golden case), and three rows of different lengths in
    slots sharing decode calls padded to a bucket of 4 (the padding row on the scratch slot),
    with one row extended by 3 positions mid-decode (text-in streaming)."""
    step_path, llm_path = tmp_path / "llm_step.fp32.onnx", tmp_path / "llm.fp32.onnx"
    entry = export_llm_step(llm, step_path)
    export_llm(llm, llm_path)
    in_names, out_names = llm_step_io_names(2)
    assert [i["name"] for i in entry["inputs"]] == in_names
    assert [o["name"] for o in entry["outputs"]] == out_names
    assert entry["batching"] == "kv_slots"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    padded = ort.InferenceSession(str(llm_path), opts, providers=["CPUExecutionProvider"])
    table = llm.speech_embedding.weight.detach().numpy()

    # One row alone: the golden case, greedy.
    prompt_text, text, prompt_speech, expected = _case(golden, "en")
    lm_input = llm.build_lm_input(torch.from_numpy(np.concatenate([prompt_text, text], 1)), torch.from_numpy(prompt_speech)).numpy()
    slots = _SlotRunner(step_path, num_slots=3, max_positions=lm_input.shape[1] + 20 * text.shape[1])
    cache = [np.zeros((1, 2, 0, 4), np.float32) for _ in range(4)]
    x, start, tokens = lm_input, 0, []
    for i in range(20 * text.shape[1]):
        ref, cache = _ort_step(padded, x, cache)
        got = slots.run(x, [1], [start])
        assert got.shape == (1, 6761)
        assert _rel(got, ref) <= 1e-4, i
        logp = torch.from_numpy(got[0]).log_softmax(-1)
        if i < 2 * text.shape[1]:
            logp[6561] = float("-inf")
        top = int(logp.argmax())
        if 6561 <= top < 6761:
            break
        start += x.shape[1]
        tokens.append(top)
        x = table[top].reshape(1, 1, -1)
    assert tokens == expected.tolist()  # argmax margins as in test_greedy_matches_golden

    # Three rows in slots 2, 0, 3 of 5 (slot 4 is scratch), decoded together.
    torch.manual_seed(2)
    lengths, row_slots, scratch = [7, 3, 11], [2, 0, 3], 4
    prompts = [torch.randn(1, n, 16).numpy() for n in lengths]
    extension = torch.randn(1, 3, 16).numpy()
    slots = _SlotRunner(step_path, num_slots=5, max_positions=32)
    ref_caches, starts, nexts = [], [], []
    ref_tokens: list[list[int]] = [[] for _ in lengths]
    got_tokens: list[list[int]] = [[] for _ in lengths]
    for r, p in enumerate(prompts):
        ref, c = _ort_step(padded, p, [np.zeros((1, 2, 0, 4), np.float32)] * 4)
        got = slots.run(p, [row_slots[r]], [0])
        assert _rel(got, ref) <= 1e-4
        ref_caches.append(c)
        starts.append(lengths[r])
        ref_tokens[r].append(_greedy_pick(ref[0]))
        got_tokens[r].append(_greedy_pick(got[0]))
        nexts.append(table[got_tokens[r][-1]].reshape(1, 1, -1))
    for step in range(6):
        if step == 3:
            # row 1 takes 3 positions at once (text fed mid-decode), alone
            ref, ref_caches[1] = _ort_step(padded, extension, ref_caches[1])
            got = slots.run(extension, [row_slots[1]], [starts[1]])
            assert _rel(got, ref) <= 1e-4
            starts[1] += 3
            ref_tokens[1].append(_greedy_pick(ref[0]))
            got_tokens[1].append(_greedy_pick(got[0]))
            nexts[1] = table[got_tokens[1][-1]].reshape(1, 1, -1)
        # three real rows and one padding row (scratch slot, start 0): a bucket of 4
        embeds = np.concatenate([*nexts, np.zeros((1, 1, 16), np.float32)], axis=0)
        got = slots.run(embeds, [*row_slots, scratch], [*starts, 0])
        for r in range(3):
            ref, ref_caches[r] = _ort_step(padded, nexts[r], ref_caches[r])
            assert _rel(got[r : r + 1], ref) <= 1e-4, (step, r)
            ref_tokens[r].append(_greedy_pick(ref[0]))
            got_tokens[r].append(_greedy_pick(got[r]))
            nexts[r] = table[got_tokens[r][-1]].reshape(1, 1, -1)
            starts[r] += 1
    assert got_tokens == ref_tokens
    # Slot 1 was never used: the step wrote nothing there.
    assert np.isnan(slots.buffers[0].numpy()[1]).all()

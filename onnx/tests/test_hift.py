"""HiFT vocoder: our module vs the official golden data, the hift_decode ONNX graph vs the module,
the fp16 variant, and the side tensors the runtime uses natively."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosy_export.checkpoint import CheckpointError
from cosy_export.hift import (
    F0_LOOK_RIGHT,
    HiftConfig,
    HiftDecodeGraph,
    HiftGenerator,
    PolyphaseUpsample,
    convs_as_2d,
    export_hift_decode,
    hift_side_tensors,
    load_hift,
    make_hift_decode_fp16,
)
from cosy_export.noise import sine_noise as _sine_rows
from cosy_export.noise import sine_noise_offset
from cosy_export.yamlcfg import load_model_config

OFFLINE_CASES = ["en", "zh", "num", "p16k"]
SPF = 480  # samples per mel frame


# ---------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def log_mel(reference_dir: Path):
    """compare.py's waveform log-mel (imported, so the metric is exactly the reference one)."""
    spec = importlib.util.spec_from_file_location("reference_compare", reference_dir / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.log_mel


@pytest.fixture(scope="module")
def model_config(tiny_official: Path):
    return load_model_config(tiny_official)


@pytest.fixture(scope="module")
def cfg(model_config) -> HiftConfig:
    return HiftConfig.from_yaml(model_config.hift_raw)


@pytest.fixture(scope="module")
def model(tiny_official: Path, cfg: HiftConfig) -> HiftGenerator:
    return load_hift(tiny_official, cfg)


@pytest.fixture(scope="module")
def noise_offset(model_config) -> int:
    return sine_noise_offset(model_config)


@pytest.fixture(scope="module")
def noise(noise_offset: int) -> torch.Tensor:
    return _sine_rows(noise_offset, SPF * 260).unsqueeze(0)  # [1, rows, 9]; longest golden mel: 246 frames


@pytest.fixture(scope="module")
def onnx_fp32(model: HiftGenerator, tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("hift") / "hift_decode.fp32.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        entry = export_hift_decode(model, path)
    return path, entry


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def _load(golden: Path, case: str, name: str) -> np.ndarray:
    return np.load(golden / case / f"{name}.npy")


def _assert_waveform(ours: np.ndarray, ref: np.ndarray, log_mel, max_abs: float, logmel: float) -> tuple[float, float]:
    ours, ref = ours.reshape(-1), ref.reshape(-1)
    assert ours.shape == ref.shape
    err = float(np.abs(ours - ref).max())
    lm = float(np.mean(np.abs(log_mel(ours) - log_mel(ref))))
    assert err <= max_abs and lm <= logmel, f"max-abs {err:.3e}, mean |dlog-mel| {lm:.3e}"
    return err, lm


# ---------------------------------------------------------------------------------- config


def test_config_from_yaml(cfg: HiftConfig, model_config) -> None:
    assert cfg.base_channels == 24 and cfg.f0_predictor.cond_channels == 24
    assert cfg.upsample_rates == (8, 5, 3) and cfg.samples_per_frame == SPF
    assert (cfg.n_fft, cfg.hop, cfg.conv_pre_look_right) == (16, 4, 4)
    assert cfg.manifest_config()["f0_look_right"] == 3
    bad = dict(model_config.hift_raw, extra_key=1)
    with pytest.raises(ValueError, match="extra_key"):
        HiftConfig.from_yaml(bad)
    with pytest.raises(ValueError, match="CausalHiFTGenerator"):
        HiftConfig.from_yaml(dict(model_config.hift_raw, __class__="cosyvoice.hifigan.generator.HiFTGenerator"))


# ---------------------------------------------------------------------------------- loading


def test_load_is_strict(tiny_official: Path, cfg: HiftConfig, tmp_path: Path) -> None:
    from dataclasses import replace

    with pytest.raises(CheckpointError, match="conv_pre.weight"):
        load_hift(tiny_official, replace(cfg, base_channels=32))
    sd = torch.load(tiny_official / "hift.pt", weights_only=True)
    del sd["conv_post.bias"]
    torch.save(sd, tmp_path / "hift.pt")
    with pytest.raises(CheckpointError, match="conv_post.bias"):
        load_hift(tmp_path, cfg)


def test_legacy_weight_norm_and_prefix(tiny_official: Path, cfg: HiftConfig, model: HiftGenerator,
                                       tmp_path: Path) -> None:
    """`generator.`-prefixed weight_g/weight_v checkpoints load to the same weights."""
    sd = torch.load(tiny_official / "hift.pt", weights_only=True)
    legacy = {}
    for key, value in sd.items():
        key = key.replace("parametrizations.weight.original0", "weight_g")
        key = key.replace("parametrizations.weight.original1", "weight_v")
        legacy["generator." + key] = value
    torch.save(legacy, tmp_path / "legacy.pt")
    other = load_hift(tmp_path / "legacy.pt", cfg)
    ref = model.state_dict()
    for key, value in other.state_dict().items():
        assert torch.equal(value, ref[key]), key  # the same float64 fold of the same tensors, one process
    assert ref["f0_predictor.condnet.0.weight"].dtype == torch.float64
    assert ref["conv_pre.weight"].dtype == torch.float32


# ---------------------------------------------------------------------------------- noise


def test_sine_noise_replay(noise_offset: int, noise: torch.Tensor, golden: Path) -> None:
    assert noise_offset == 1_755_066  # §11 sum for V 6561, I 80, S 192, O 80, F 80, C 24, N 1
    head = json.loads((golden / "construction_constants.json").read_text())[
        "hift.m_source.l_sin_gen.sine_waves"]["head"]
    # integer-only: (mt19937 output & 0xFFFFFF) / 2^24 is exact on every CPU
    np.testing.assert_array_equal(noise.reshape(-1)[: len(head)].numpy(), np.asarray(head, np.float32))
    # the runtime's form: raw mt19937 outputs (numpy RandomState(0) is the same engine)
    raw = np.random.RandomState(0).randint(0, 2**32, size=noise_offset + 64, dtype=np.uint32)[noise_offset:]
    np.testing.assert_array_equal((raw & 0xFFFFFF).astype(np.float32) / np.float32(2**24),
                                  noise.reshape(-1)[:64].numpy())


# ---------------------------------------------------------------------------------- golden


@pytest.mark.parametrize("case", OFFLINE_CASES)
def test_golden_offline(case: str, model: HiftGenerator, noise: torch.Tensor, golden: Path, log_mel) -> None:
    mel = torch.from_numpy(_load(golden, case, "flow_mel"))
    wav, src, f0 = model.inference(mel, noise, finalize=True)
    f0_err = np.abs(f0.numpy() - _load(golden, case, "hift_f0")).max()
    src_err = np.abs(src.numpy() - _load(golden, case, "hift_source")).max()
    assert f0_err <= 1e-4, f0_err          # compare.py: 1e-2 Hz
    assert src_err <= 1e-5, src_err        # compare.py: 5e-3
    # compare.py: max-abs 0.05, log-mel 0.025; we are ~1e-5 away, so check much tighter
    _assert_waveform(wav.numpy(), _load(golden, case, "waveform"), log_mel, 1e-3, 1e-3)


def test_golden_stream(model: HiftGenerator, noise: torch.Tensor, golden: Path, log_mel) -> None:
    """Re-vocode the accumulated mel per call (96, 196 non-final; 246 final) and emit new tails."""
    meta = json.loads((golden / "stream" / "meta.json").read_text())
    mel = torch.from_numpy(_load(golden, "stream", "flow_mel"))
    emitted, chunks = 0, []
    for call in meta["hift_calls"]:
        frames, final = call["mel_frames"], call["finalize"]
        wav, src, f0 = model.inference(mel[:, :, :frames], noise, finalize=final)
        assert wav.shape[1] == call["samples"] == (SPF * frames if final else SPF * (frames - 8))
        chunks.append(wav[:, emitted:].numpy())
        emitted = wav.shape[1]
    np.testing.assert_array_equal([c.shape[1] for c in chunks], _load(golden, "stream", "chunk_samples"))
    assert np.abs(f0.numpy() - _load(golden, "stream", "hift_f0")).max() <= 1e-4
    assert np.abs(src.numpy() - _load(golden, "stream", "hift_source")).max() <= 1e-5
    _assert_waveform(np.concatenate(chunks, axis=1), _load(golden, "stream", "waveform"), log_mel, 1e-3, 1e-3)


def test_decode_left_context_is_enough(tiny_official: Path, model: HiftGenerator, cfg: HiftConfig,
                                       noise: torch.Tensor) -> None:
    """A `hift_decode` call over a window that starts `decode_left_context_frames` before the
    first wanted frame gives that frame's samples (and all later ones) as a whole-prefix call
    does; the runtime's streaming relies on it. In float64 the two agree up to rounding (bound
    1e-12, about 1000x the 1e-15 measured, which varies with the CPU's kernels; a 27-frame context
    already differs by 1e-8, so the bound really covers the receptive field); in float32 up to
    rounding (2e-5). Contexts of 10 and 20 frames miss either bound by more than 100x, so the check
    can fail."""
    ctx = cfg.decode_left_context_frames()
    assert cfg.manifest_config()["decode_left_context_frames"] == ctx
    assert 20 <= ctx <= 60, ctx  # [8, 5, 3] / kernels (16, 11, 7): about 26 frames of reach
    torch.manual_seed(3)
    frames, first = 150, 100
    mel = torch.randn(1, 80, frames) * 2
    f0 = torch.rand(1, frames) * 300
    model64 = load_hift(tiny_official, cfg).double()
    with torch.inference_mode():
        src = model.source(f0, noise)
        for m, dtype, tol in ((model64, torch.float64, 1e-12), (model, torch.float32, 2e-5)):
            x, s = mel.to(dtype), src.to(dtype)
            want = m.decode(F.pad(x, (0, cfg.conv_pre_look_right)), s)[:, SPF * first:]

            def windowed(context: int) -> torch.Tensor:
                w0 = first - context
                out = m.decode(F.pad(x[:, :, w0:], (0, cfg.conv_pre_look_right)), s[:, :, SPF * w0:])
                return out[:, SPF * context:]

            got = windowed(ctx)
            assert got.shape == want.shape
            assert (got - want).abs().max().item() <= tol, dtype
            for short in (10, 20):  # too short: the error is signal, not rounding
                assert (windowed(short) - want).abs().max().item() > 100 * tol, (dtype, short)


# ---------------------------------------------------------------------------------- DFT as convs


def test_conv_dft_matches_torch(model: HiftGenerator) -> None:
    torch.manual_seed(1)
    x = torch.randn(1, 1, SPF * 7)
    ref = torch.view_as_real(torch.stft(x[:, 0], 16, 4, 16, window=model.stft_window, center=True,
                                        return_complex=True))
    conv = model.stft_conv(x)
    np.testing.assert_allclose(conv.numpy(), torch.cat([ref[..., 0], ref[..., 1]], 1).numpy(), atol=2e-5)
    real, imag = torch.randn(1, 9, 121), torch.randn(1, 9, 121)
    ref_wav = torch.istft(torch.complex(real, imag), 16, 4, 16, window=model.stft_window, center=True)
    np.testing.assert_allclose(model.istft_conv(real, imag).numpy(), ref_wav.numpy(), atol=2e-5)


# ---------------------------------------------------------------------------------- ONNX


def test_polyphase_upsample_matches_nearest_conv(model: HiftGenerator, cfg: HiftConfig) -> None:
    """The exported up-sampling (one conv at the input rate with rate x the channels, phases
    interleaved) is nearest up-sampling + the left-causal conv: to rounding in float64 (so the tap
    algebra is right), to float32 rounding in float32, at every stage, for any length."""
    import copy

    torch.manual_seed(4)
    for up, rate in zip(model.ups, cfg.upsample_rates):
        k = up.kernel_size[0]
        for conv, dtype, tol in ((up, torch.float32, 1e-6), (copy.deepcopy(up).double(), torch.float64, 1e-13)):
            poly = PolyphaseUpsample(conv, rate)
            assert poly.taps == -(-(k - 1) // rate) + 1 == 3  # [8, 5, 3] with kernels (16, 11, 7)
            for length in (1, 2, 7, 40):
                x = torch.randn(1, conv.in_channels, length, dtype=dtype)
                with torch.no_grad():
                    want = F.conv1d(F.pad(F.interpolate(x, scale_factor=rate, mode="nearest"), (k - 1, 0)),
                                    conv.weight, conv.bias)
                    got = poly(x)
                assert got.shape == want.shape == (1, conv.out_channels, rate * length)
                rel = ((got - want).abs().max() / want.abs().max()).item()
                assert rel <= tol, (rate, dtype, length, rel)
    graph = HiftDecodeGraph(model)
    mel, src = torch.randn(1, 80, 30), torch.rand(1, 1, SPF * 26) * 0.2 - 0.1
    with torch.no_grad():
        want = model.decode(mel, src, dft="conv")
        got = graph(mel, src)
    assert ((got - want).abs().max() / want.abs().max()).item() <= 1e-5


def test_exported_graph_form(model: HiftGenerator, onnx_fp32, tmp_path: Path) -> None:
    """`hift_decode` as exported: every conv is 2-D over [B, C, 1, T] (ONNX Runtime's CPU provider
    runs those in its NCHWc layout), the causal zero pads sit inside the convs (only the STFT's
    reflect pad is a Pad node), the up-sampling is polyphase (no Resize) and Snake squares with a
    Mul. `convs_as_2d` alone changes the output only by float rounding."""
    import onnx

    graph = onnx.load(str(onnx_fp32[0])).graph
    ops = [n.op_type for n in graph.node]
    assert ops.count("Resize") == 0 and ops.count("Pow") == 0
    assert [n.attribute[0].s for n in graph.node if n.op_type == "Pad"] == [b"reflect"]
    dims = {i.name: list(i.dims) for i in graph.initializer}
    convs = [n for n in graph.node if n.op_type == "Conv"]
    assert len(convs) == 81 and all(len(dims[n.input[1]]) == 4 and dims[n.input[1]][2] == 1 for n in convs)
    # the pass on a plain torch export: the same outputs up to rounding
    raw = tmp_path / "raw.onnx"
    mel, src = torch.randn(1, 80, 24), torch.rand(1, 1, SPF * 20) * 0.2 - 0.1
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(HiftDecodeGraph(model).eval(), (mel, src), str(raw), dynamo=False, opset_version=17,
                          input_names=["mel", "source"], output_names=["waveform"],
                          dynamic_axes={"mel": {2: "t"}, "source": {2: "s"}}, do_constant_folding=True)
    raw_model = onnx.load(str(raw))
    n_pads = sum(n.op_type == "Pad" for n in raw_model.graph.node)
    assert n_pads > 70  # one per causal conv before the pass
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(convs_as_2d(raw_model), str(rewritten))
    feeds = {"mel": torch.randn(1, 80, 57).numpy(), "source": (torch.rand(1, 1, SPF * 53) * 0.2 - 0.1).numpy()}
    a = _session(raw).run(None, feeds)[0]
    b = _session(rewritten).run(None, feeds)[0]
    assert np.abs(a - b).max() / np.abs(a).max() <= 1e-5


def test_onnx_decode_dynamic(model: HiftGenerator, onnx_fp32) -> None:
    path, entry = onnx_fp32
    assert [i["name"] for i in entry["inputs"]] == ["mel", "source"]
    assert entry["outputs"] == [{"name": "waveform", "dtype": "float32", "shape": [1, "samples"]}]
    assert entry["variants"]["fp32"]["file"] == path.name
    sess = _session(path)
    torch.manual_seed(2)
    # (frames, source frames): exact source, and a longer source (only 120*frames+1 columns used)
    for frames, source_frames in [(20, 20), (37, 41), (5, 9)]:
        mel = torch.randn(1, 80, frames + 4)
        src = torch.rand(1, 1, SPF * source_frames) * 0.2 - 0.1
        with torch.no_grad():
            ref = model.decode(mel, src, dft="fft").numpy()
        out = sess.run(None, {"mel": mel.numpy(), "source": src.numpy()})[0]
        assert out.shape == (1, SPF * frames)
        rel = np.abs(out - ref).max() / np.abs(ref).max()
        assert rel <= 1e-4, (frames, rel)


def _onnx_call(sess, model: HiftGenerator, mel: torch.Tensor, noise: torch.Tensor, final: bool) -> np.ndarray:
    """The runtime convention of docs/model-format.md for one HiFT call over T accumulated frames."""
    with torch.no_grad():
        f0 = model.predict_f0(mel, final).float()
        src = model.source(f0, noise)
    if final:
        feed_mel = F.pad(mel, (0, 4))                     # official zero pad of conv_pre
    else:
        feed_mel = mel[:, :, : mel.shape[2] - F0_LOOK_RIGHT]  # frames = T - 7, 4 context frames
    out = sess.run(None, {"mel": feed_mel.numpy(), "source": src.numpy()})[0]
    return out if final else out[:, :-SPF]


def test_onnx_golden_conventions(model: HiftGenerator, onnx_fp32, noise: torch.Tensor, golden: Path,
                                 log_mel) -> None:
    sess = _session(onnx_fp32[0])
    mel = torch.from_numpy(_load(golden, "en", "flow_mel"))
    out = _onnx_call(sess, model, mel, noise, final=True)
    _assert_waveform(out, _load(golden, "en", "waveform"), log_mel, 1e-3, 1e-3)
    # stream: non-final calls emit 480*(T-8); the concatenated tails match the golden waveform
    meta = json.loads((golden / "stream" / "meta.json").read_text())
    smel = torch.from_numpy(_load(golden, "stream", "flow_mel"))
    emitted, chunks = 0, []
    for call in meta["hift_calls"]:
        wav = _onnx_call(sess, model, smel[:, :, : call["mel_frames"]], noise, call["finalize"])
        assert wav.shape[1] == call["samples"]
        chunks.append(wav[:, emitted:])
        emitted = wav.shape[1]
    _assert_waveform(np.concatenate(chunks, axis=1), _load(golden, "stream", "waveform"), log_mel, 1e-3, 1e-3)


def test_fp16_variant(model: HiftGenerator, onnx_fp32, noise: torch.Tensor, golden: Path, log_mel,
                      tmp_path: Path) -> None:
    fp16_path = tmp_path / "hift_decode.fp16.onnx"
    entry = make_hift_decode_fp16(onnx_fp32[0], fp16_path)
    assert entry["file"] == fp16_path.name and entry["bytes"] == fp16_path.stat().st_size
    import onnx

    graph = onnx.load(str(fp16_path)).graph
    assert [i.type.tensor_type.elem_type for i in graph.input] == [onnx.TensorProto.FLOAT] * 2
    assert graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert any(init.data_type == onnx.TensorProto.FLOAT16 for init in graph.initializer)
    sess = _session(fp16_path)
    mel = torch.from_numpy(_load(golden, "en", "flow_mel"))
    out = _onnx_call(sess, model, mel, noise, final=True)
    # measured 0.0051 / 0.0078 on this model (0.014 / 0.0065 before the graph took its polyphase,
    # 2-D conv form); compare.py allows 0.05 / 0.025
    _assert_waveform(out, _load(golden, "en", "waveform"), log_mel, 0.03, 0.015)


# ---------------------------------------------------------------------------------- side tensors


def _f0_native(side: dict[str, np.ndarray], mel: np.ndarray, final: bool) -> np.ndarray:
    """The runtime's f0 algorithm (docs/model-format.md) in numpy float64."""
    x = mel[0].astype(np.float64)
    if final:
        x = np.pad(x, ((0, 0), (0, F0_LOOK_RIGHT)))
    for i in range(0, 10, 2):
        w, b = side[f"hift.f0.condnet.{i}.weight"], side[f"hift.f0.condnet.{i}.bias"]
        k = w.shape[2]
        if i > 0:
            x = np.pad(x, ((0, 0), (k - 1, 0)))
        t = x.shape[1] - k + 1
        y = b[:, None] + sum(w[:, :, j] @ x[:, j:j + t] for j in range(k))
        x = np.where(y > 0, y, np.expm1(np.minimum(y, 0)))  # ELU
    f0 = side["hift.f0.classifier.weight"] @ x + side["hift.f0.classifier.bias"][:, None]
    return np.abs(f0[0])


def _source_native(side: dict[str, np.ndarray], f0: np.ndarray, noise: np.ndarray, cfg: HiftConfig) -> np.ndarray:
    """The runtime's source algorithm (cosyvoice3.md §6.3) in numpy float32 op order; the phase
    cumsum accumulates in float64 and is rounded per frame, as torch's CPU cumsum does."""
    f32 = np.float32
    h = np.arange(1, 10, dtype=f32)
    rad = np.remainder(f0.astype(f32)[:, None] * h / f32(cfg.sampling_rate), f32(1))  # [T, 9]
    phase = np.cumsum(rad.astype(np.float64), axis=0).astype(f32) * f32(2) * f32(np.pi) * f32(SPF)
    sines = np.sin(phase) * f32(cfg.nsf_alpha)
    uv = (f0 > cfg.nsf_voiced_threshold).astype(f32)[:, None]
    amp = uv * f32(cfg.nsf_sigma) + (f32(1) - uv) * f32(cfg.nsf_alpha) / f32(3)
    n = len(f0) * SPF
    sig = np.repeat(sines * uv, SPF, axis=0) + np.repeat(amp, SPF, axis=0) * noise[:n]
    lin = sig @ side["hift.source.l_linear.weight"][0] + side["hift.source.l_linear.bias"][0]
    return np.tanh(lin)


def test_side_tensors(model: HiftGenerator, cfg: HiftConfig, noise: torch.Tensor, golden: Path) -> None:
    side = hift_side_tensors(model)
    c = cfg.f0_predictor.cond_channels
    assert side["hift.f0.condnet.0.weight"].shape == (c, 80, 4)
    for i in (2, 4, 6, 8):
        assert side[f"hift.f0.condnet.{i}.weight"].shape == (c, c, 3)
    assert side["hift.f0.classifier.weight"].shape == (1, c)
    assert side["hift.source.l_linear.weight"].shape == (1, 9)
    assert side["hift.source.l_linear.bias"].shape == (1,)
    for key, value in side.items():
        assert value.dtype == (np.float32 if key.startswith("hift.source.") else np.float64), key
    mel = _load(golden, "stream", "flow_mel")[:, :, :196]
    for final in (True, False):
        f0 = _f0_native(side, mel, final)
        ref = model.predict_f0(torch.from_numpy(mel), final)[0].detach().numpy()
        assert f0.shape == ((196,) if final else (193,))
        np.testing.assert_allclose(f0, ref, rtol=0, atol=1e-9)
    f0 = model.predict_f0(torch.from_numpy(mel), True).float()
    src = _source_native(side, f0[0].numpy(), noise[0].numpy(), cfg)
    with torch.no_grad():
        ref = model.source(f0, noise)[0, 0].numpy()
    assert np.abs(src - ref).max() <= 1e-5

"""Construction-time noise: flow rand_noise bits and the HiFT sine-noise replay (cosyvoice3.md §11)."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import vectorised_normal_kernel

from cosy_export.noise import flow_noise, official_full_size_raw, sine_noise, sine_noise_offset
from cosy_export.yamlcfg import CLASS_KEY, ConfigError, load_model_config

FULL_SIZE_K = 5_052_970


@pytest.fixture(scope="module")
def constants(golden: Path) -> dict:
    return json.loads((golden / "construction_constants.json").read_text())


def test_flow_noise_bits(constants: dict) -> None:
    ref = constants["flow.decoder.rand_noise"]
    noise = flow_noise()
    assert noise.shape == (80, 15000) and noise.dtype.is_floating_point
    # the json's "head" is rand_noise[0, :4, :4] (first 4 columns of the first 4 mel rows)
    head = np.asarray(ref["head"], np.float32)
    if not vectorised_normal_kernel():  # exact bits need torch's AVX2/AVX512 normal kernel (§11)
        np.testing.assert_allclose(noise[:4, :4].numpy().reshape(-1), head, rtol=0, atol=1e-5)
        return
    # integer MT19937 draws through the same vectorised float32 Box-Muller as the official run
    np.testing.assert_array_equal(noise[:4, :4].numpy().reshape(-1), head)
    digest = hashlib.sha256(noise.numpy().astype("<f4").tobytes()).hexdigest()
    assert digest == ref["sha256"]


def test_offset_tiny_and_full(tiny_official: Path) -> None:
    tiny = load_model_config(tiny_official)
    expected_tiny = 1_200_000 + 6561 * 80 + (80 * 192 + 80) + (4 * 24 * 80 + 24) + 4 * (3 * 24 * 24 + 24) + (24 + 1) + 9
    assert sine_noise_offset(tiny) == expected_tiny
    assert sine_noise_offset(official_full_size_raw()) == FULL_SIZE_K


def test_offset_follows_document_order() -> None:
    raw = official_full_size_raw()
    flow = raw["flow"]
    # pre-lookahead layer listed after the decoder: its init draws now come after the reset
    reordered = {k: v for k, v in flow.items() if k != "pre_lookahead_layer"}
    reordered["pre_lookahead_layer"] = dict(flow["pre_lookahead_layer"], in_channels=80, pre_lookahead_len=3)
    raw2 = dict(raw, flow=reordered)
    extra = (1024 * 80 * 4 + 1024) + (80 * 1024 * 3 + 80)
    assert sine_noise_offset(raw2) == FULL_SIZE_K + extra
    # V·I not a multiple of 16 costs 16 more outputs
    raw3 = copy.deepcopy(raw)
    raw3["flow"]["vocab_size"] = 6563  # 6563·80 = 525040 = 16·32815 -> still a multiple
    assert sine_noise_offset(raw3) == FULL_SIZE_K + 160
    raw3["flow"]["input_size"] = 81  # 6563·81 = 531603, not a multiple of 16
    assert sine_noise_offset(raw3) == FULL_SIZE_K + (6563 * 81 - 6561 * 80) + 16
    # unknown objects between the flow decoder and hift are refused, not guessed
    raw4 = copy.deepcopy(raw)
    raw4["flow"]["extra"] = {CLASS_KEY: "x.Unknown"}
    with pytest.raises(ConfigError, match="x.Unknown"):
        sine_noise_offset(raw4)


def test_sine_noise_tiny_head(tiny_official: Path, constants: dict) -> None:
    ref = constants["hift.m_source.l_sin_gen.sine_waves"]
    head = np.asarray(ref["head"], np.float32)
    rows = sine_noise(sine_noise_offset(load_model_config(tiny_official)), len(head) // 9)
    assert rows.shape == (len(head) // 9, 9)
    # integer-only: each value is (mt19937 output & 0xFFFFFF) / 2^24, exact on every CPU
    np.testing.assert_array_equal(rows.numpy().reshape(-1), head)
    rand_ini = constants["hift.m_source.l_sin_gen.rand_ini"]["head"]
    # rand_ini is the 9 draws right before sine_waves (its column 0 zeroed afterwards)
    before = sine_noise(sine_noise_offset(load_model_config(tiny_official)) - 9, 1).numpy()[0]
    np.testing.assert_array_equal(before[1:], np.asarray(rand_ini[1:], np.float32))


def test_sine_noise_full_size_far_offsets() -> None:
    """Values recorded with the official loader on the full-size yaml (cosyvoice3.md §11)."""
    first = [0.922825992, 0.47744751, 0.827051818, 0.28345716, 0.793481588, 0.173434794, 0.852375031, 0.922854602, 0.731019974]
    flat = sine_noise(FULL_SIZE_K, 30_000_000 // 9 + 1).numpy().reshape(-1)
    np.testing.assert_allclose(flat[:9], first, rtol=0, atol=1e-8)
    assert abs(flat[1_000_000] - 0.877275884) < 1e-8
    assert abs(flat[30_000_000] - 0.515471756) < 1e-8


def test_sine_noise_tiny_full_sha(tiny_official: Path, constants: dict) -> None:
    """The whole [7.2M, 9] tensor (260 MB) hashes to the value recorded by the official loader."""
    ref = constants["hift.m_source.l_sin_gen.sine_waves"]
    rows = sine_noise(sine_noise_offset(load_model_config(tiny_official)))
    assert list(rows.shape) == ref["shape"][1:]
    # integer-only draws (see above): the same bits on every CPU
    assert hashlib.sha256(rows.numpy().astype("<f4", copy=False).tobytes()).hexdigest() == ref["sha256"]

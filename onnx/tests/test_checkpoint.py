"""checkpoint: weights-only loading, strict matching with precise errors, weight-norm folding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from cosy_export.checkpoint import (
    CheckpointError,
    check_dims,
    fold_weight_norm,
    load_state_dict,
    match_state_dict,
    strip_prefix,
)


class _Evil:
    def __reduce__(self):  # would run code if unpickled without weights_only
        return (print, ("pwned",))


def test_load_refuses_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    torch.save({"w": torch.zeros(2), "x": _Evil()}, bad)
    with pytest.raises(CheckpointError, match="bad.pt"):
        load_state_dict(bad)
    with pytest.raises(CheckpointError, match="not found"):
        load_state_dict(tmp_path / "nope.pt")
    good = tmp_path / "good.pt"
    torch.save({"w": torch.arange(3.0)}, good)
    assert torch.equal(load_state_dict(good)["w"], torch.arange(3.0))  # written and read back: exact
    notdict = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], notdict)
    with pytest.raises(CheckpointError, match="state dict"):
        load_state_dict(notdict)


def test_match_errors_name_first_bad_key() -> None:
    mod = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    sd = {k: v.clone() for k, v in mod.state_dict().items()}
    target = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    match_state_dict(target, sd, "f.pt")
    assert torch.equal(target[1].weight, mod[1].weight)  # a copy: exact

    missing = dict(sd)
    del missing["1.bias"]
    with pytest.raises(CheckpointError, match=r"f\.pt: missing key '1\.bias'"):
        match_state_dict(target, missing, "f.pt")
    extra = dict(sd, **{"2.weight": torch.zeros(1)})
    with pytest.raises(CheckpointError, match=r"unexpected key '2\.weight'"):
        match_state_dict(target, extra, "f.pt")
    match_state_dict(target, extra, "f.pt", unused=["2.weight"])
    shaped = dict(sd, **{"0.weight": torch.zeros(5, 3)})
    with pytest.raises(CheckpointError, match=r"'0\.weight' has shape \(5, 3\) in the file but \(4, 3\)"):
        match_state_dict(target, shaped, "f.pt")


@pytest.mark.parametrize("legacy", [False, True])
def test_fold_weight_norm_matches_torch(legacy: bool) -> None:
    torch.manual_seed(3)
    conv = nn.Conv1d(5, 7, 3)
    if legacy:
        conv = torch.nn.utils.weight_norm(conv)
    else:
        conv = torch.nn.utils.parametrizations.weight_norm(conv)
    with torch.no_grad():
        if legacy:
            conv.weight_g.mul_(torch.rand_like(conv.weight_g) + 0.5)
        else:
            conv.parametrizations.weight.original0.mul_(1.5)
    sd = {"generator.c." + k: v.detach() for k, v in conv.state_dict().items()}
    folded = fold_weight_norm(strip_prefix(sd, "generator."), "h.pt")
    assert sorted(folded) == ["c.bias", "c.weight"]
    x = torch.randn(2, 5, 11)
    plain = nn.Conv1d(5, 7, 3)
    plain.load_state_dict({"weight": folded["c.weight"], "bias": folded["c.bias"]})
    expected = conv(x)
    torch.testing.assert_close(plain(x), expected, rtol=1e-6, atol=1e-6)
    assert folded["c.weight"].dtype == torch.float32


def test_fold_errors() -> None:
    sd = {"c.parametrizations.weight.original0": torch.ones(2, 1, 1)}
    with pytest.raises(CheckpointError, match="original1"):
        fold_weight_norm(sd, "h.pt")
    sd = {"c.weight_v": torch.ones(2, 3)}
    with pytest.raises(CheckpointError, match="no matching g"):
        fold_weight_norm(sd, "h.pt")


def test_fold_official_hift(tiny_official: Path) -> None:
    sd = fold_weight_norm(load_state_dict(tiny_official / "hift.pt"), tiny_official / "hift.pt")
    assert not any("parametrizations" in k for k in sd)
    assert tuple(sd["conv_pre.weight"].shape) == (24, 80, 5)
    # the tiny set stores g = ||v|| (README 2.3), so folding returns v up to rounding
    raw = load_state_dict(tiny_official / "hift.pt")
    torch.testing.assert_close(sd["conv_pre.weight"], raw["conv_pre.parametrizations.weight.original1"],
                               rtol=1e-6, atol=1e-7)


def test_check_dims() -> None:
    check_dims("dit.dim", 48, 48, "flow.pt")
    with pytest.raises(CheckpointError, match=r"flow\.pt: dit\.dim is 64 in the config but 48"):
        check_dims("dit.dim", 64, 48, "flow.pt")

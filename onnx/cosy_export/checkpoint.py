"""Safe checkpoint loading, strict key/shape matching and weight-norm folding.

A checkpoint is data: it is read with `torch.load(weights_only=True)`, which refuses pickled code.
Every mismatch between a file and our own modules is an error that names the first offending key
and the file, so a wrong config or a foreign checkpoint fails loudly instead of half-loading.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

StateDict = dict[str, Tensor]

_PARAM_G = ".parametrizations.weight.original0"
_PARAM_V = ".parametrizations.weight.original1"
_LEGACY_G = ".weight_g"
_LEGACY_V = ".weight_v"


class CheckpointError(ValueError):
    """A checkpoint cannot be read, or disagrees with the module or with the yaml."""


def load_state_dict(path: Path | str) -> StateDict:
    """Read a `state_dict()` file on the CPU without running any pickled code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # torch raises several types (UnpicklingError, RuntimeError, ...)
        raise CheckpointError(f"{path}: cannot load as a weights-only state dict: {err}") from None
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{path}: expected a state dict (mapping), got {type(obj).__name__}")
    out: StateDict = {}
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, Tensor):
            raise CheckpointError(f"{path}: entry {key!r} is not a named tensor ({type(value).__name__})")
        out[key] = value
    return out


def strip_prefix(sd: Mapping[str, Tensor], prefix: str) -> StateDict:
    """Drop a leading `prefix` (e.g. "generator." of a HiFiGan wrapper checkpoint) from every key."""
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in sd.items()}


def _weight_norm_pairs(sd: Mapping[str, Tensor]) -> dict[str, tuple[str, str]]:
    """conv name -> (g key, v key) for both the parametrization and the legacy naming."""
    pairs: dict[str, tuple[str, str]] = {}
    for key in sd:
        for g_suffix, v_suffix in ((_PARAM_G, _PARAM_V), (_LEGACY_G, _LEGACY_V)):
            if key.endswith(g_suffix):
                base = key[: -len(g_suffix)]
                pairs[base] = (key, base + v_suffix)
    return pairs


def fold_weight_norm(sd: Mapping[str, Tensor], file: Path | str = "<state dict>") -> StateDict:
    """Replace every weight-normed (g, v) pair by the plain `<conv>.weight` = g·v/‖v‖.

    The norm runs over all dims but 0 (torch's default `dim=0`), in float64, and the result is cast
    back to v's dtype. Accepts `parametrizations.weight.original0/1` and legacy `weight_g/weight_v`.
    Keys keep their original order (the folded weight takes the place of g).
    """
    pairs = _weight_norm_pairs(sd)
    drop: set[str] = set()
    folded: dict[str, Tensor] = {}
    for base, (g_key, v_key) in pairs.items():
        if v_key not in sd:
            raise CheckpointError(f"{file}: {g_key} has no matching {v_key}")
        if base + ".weight" in sd:
            raise CheckpointError(f"{file}: {base} has both a plain weight and weight-norm parameters")
        g, v = sd[g_key], sd[v_key]
        if g.numel() != v.shape[0]:
            raise CheckpointError(
                f"{file}: weight-norm g {g_key} has shape {tuple(g.shape)}, expected {v.shape[0]} values "
                f"(one per output channel of {v_key} {tuple(v.shape)})"
            )
        v64 = v.to(torch.float64)
        norm = v64.reshape(v64.shape[0], -1).norm(dim=1)
        scale = g.to(torch.float64).reshape(-1) / norm
        weight = v64 * scale.reshape((-1,) + (1,) * (v64.dim() - 1))
        folded[g_key] = weight.to(v.dtype)
        drop.add(v_key)
    for key in sd:
        for suffix in (_PARAM_V, _LEGACY_V):
            if key.endswith(suffix) and key not in drop:
                raise CheckpointError(f"{file}: {key} has no matching g parameter")
    out: StateDict = {}
    for key, value in sd.items():
        if key in drop:
            continue
        if key in folded:
            base = key[: -len(_PARAM_G)] if key.endswith(_PARAM_G) else key[: -len(_LEGACY_G)]
            out[base + ".weight"] = folded[key]
        else:
            out[key] = value
    return out


def match_state_dict(
    module: nn.Module,
    sd: Mapping[str, Tensor],
    file: Path | str,
    unused: Iterable[str] = (),
) -> None:
    """Load `sd` into `module` strictly: same keys, same shapes.

    `unused` lists keys that the file carries but our module deliberately lacks (e.g. the tied,
    never-used `llm.model.lm_head.weight`); they are accepted only if present in the file. Raises
    CheckpointError naming the first missing key, the first unexpected key, or the first key whose
    shape differs (both shapes), and the file.
    """
    expected = module.state_dict()
    skip = set(unused)
    for key, tensor in expected.items():
        if key not in sd:
            raise CheckpointError(f"{file}: missing key {key!r} (expected shape {tuple(tensor.shape)})")
    for key in sd:
        if key not in expected and key not in skip:
            raise CheckpointError(f"{file}: unexpected key {key!r} (shape {tuple(sd[key].shape)})")
    for key, tensor in expected.items():
        if tuple(sd[key].shape) != tuple(tensor.shape):
            raise CheckpointError(
                f"{file}: key {key!r} has shape {tuple(sd[key].shape)} in the file "
                f"but {tuple(tensor.shape)} in the model built from the config"
            )
    for key, tensor in expected.items():
        if not (sd[key].is_floating_point() or sd[key].dtype == tensor.dtype):
            raise CheckpointError(f"{file}: key {key!r} has dtype {sd[key].dtype}, expected {tensor.dtype}")
    module.load_state_dict({k: sd[k] for k in expected}, strict=True)


def check_dims(name: str, yaml_value: int | float, weight_value: int | float, file: Path | str) -> None:
    """Raise when a yaml/config dimension disagrees with what the weights imply."""
    if yaml_value != weight_value:
        raise CheckpointError(
            f"{file}: {name} is {yaml_value} in the config but {weight_value} according to the weights"
        )


def tensor_shape(sd: Mapping[str, Tensor], key: str, file: Path | str) -> tuple[int, ...]:
    """Shape of `sd[key]`, or a CheckpointError naming the key and the file."""
    if key not in sd:
        raise CheckpointError(f"{file}: missing key {key!r}")
    return tuple(sd[key].shape)

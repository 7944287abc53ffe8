"""Reading state dicts from disk or from torchvision's download, and fitting them to a model.

Every failure a user can cause (a wrong path, a file that is not a state dict, weights of
another architecture, no network) becomes one `ModelError` line that names the path or URL,
what was expected and what was found. torch's own messages run to several lines, so they are
summarised here, never passed through.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from drivepercept.models.base import ModelError

# Keys a state dict may wrap the weights under (torchvision's reference training scripts
# save {"model": ..., "optimizer": ..., "epoch": ...}; Lightning and others use "state_dict").
_WRAPPER_KEYS = ("state_dict", "model")

# BatchNorm's batch counter is only read in training. Checkpoints trained with a frozen
# backbone (torchvision's detection weights) lack it for every backbone layer, while our
# models are built with plain BatchNorm2d (faster than FrozenBatchNorm2d at inference), so a
# missing counter is not a mismatch.
_OPTIONAL_SUFFIX = ".num_batches_tracked"


def read_state_dict(path: str, *, model_name: str) -> dict[str, torch.Tensor]:
    """Loads a state dict saved with `torch.save(model.state_dict(), path)`.

    Only tensors and plain containers are unpickled (`weights_only=True`): a weights file is
    data, never code.

    Args:
        path: the file.
        model_name: the model the weights are for (named in error messages).

    Returns:
        Parameter and buffer name -> tensor, on the CPU.

    Raises:
        ModelError: the file is missing or unreadable, or holds no state dict.
    """
    expected = f"expected a state dict for {model_name} saved with torch.save"
    file = Path(path)
    if not file.exists():
        raise ModelError(f"weights file not found: {path} ({expected})")
    if not file.is_file():
        raise ModelError(f"weights path is not a file: {path} ({expected})")
    try:
        with warnings.catch_warnings():  # torch warns about a plain pickle's protocol
            warnings.simplefilter("ignore")
            loaded: object = torch.load(file, map_location="cpu", weights_only=True)
    except OSError as exc:
        raise ModelError(f"cannot read weights file {path}: {short_reason(exc)}") from exc
    except Exception as exc:  # on arbitrary bytes the unpickler fails with any error
        raise ModelError(f"weights file {path} is {_why_unreadable(exc)}; {expected}") from exc
    return as_state_dict(loaded, source=path, expected=expected)


def download_state_dict(weights: Any, *, model_name: str) -> dict[str, torch.Tensor]:
    """Fetches torchvision's pretrained weights (or takes them from torch.hub's cache).

    Args:
        weights: a torchvision `WeightsEnum` member.
        model_name: the registry name (named in error messages).

    Returns:
        The state dict.

    Raises:
        ModelError: the download failed (no network, proxy, full disk, corrupt file, hash
            mismatch); the message says where to fetch the file by hand.
    """
    url = str(weights.url)
    try:
        loaded: object = weights.get_state_dict(progress=False, check_hash=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
        # URLError and HTTPError are OSErrors; a hash mismatch is a RuntimeError.
        raise ModelError(
            f"could not download the pretrained weights of {model_name} from {url} "
            f"({short_reason(exc)}); download the .pth elsewhere and pass --weights PATH"
        ) from exc
    return as_state_dict(loaded, source=url, expected=f"expected a state dict for {model_name}")


def as_state_dict(loaded: object, *, source: str, expected: str) -> dict[str, torch.Tensor]:
    """Checks that `loaded` is a state dict (unwrapping {"state_dict": ...} or {"model": ...}).

    Raises:
        ModelError: it is not a str -> tensor mapping.
    """
    if not isinstance(loaded, Mapping):
        raise ModelError(
            f"weights file {source} holds a {type(loaded).__name__}, not a dict; {expected}"
        )
    for key in _WRAPPER_KEYS:
        inner = loaded.get(key)
        if isinstance(inner, Mapping):
            loaded = inner
            break
    not_tensors = [
        k for k, v in loaded.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))
    ]
    if not loaded or not_tensors:
        found = f"entry {not_tensors[0]!r} is not a tensor" if not_tensors else "it is empty"
        raise ModelError(f"weights file {source} is not a state dict ({found}); {expected}")
    return dict(loaded)


def apply_state_dict(
    module: torch.nn.Module, state: Mapping[str, torch.Tensor], *, source: str, model_name: str
) -> None:
    """Copies `state` into `module`, insisting that every key and shape matches.

    This is `load_state_dict(strict=True)` with two differences: BatchNorm batch counters may
    be absent (see `_OPTIONAL_SUFFIX`), and a mismatch is summarised on one line.

    Raises:
        ModelError: the weights belong to another architecture or class count.
    """
    own = module.state_dict()
    missing = [k for k in own if k not in state and not k.endswith(_OPTIONAL_SUFFIX)]
    unexpected = [k for k in state if k not in own]
    wrong_shape = [k for k in state if k in own and state[k].shape != own[k].shape]
    if missing or unexpected or wrong_shape:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys, e.g. {missing[0]!r}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys, e.g. {unexpected[0]!r}")
        if wrong_shape:
            k = wrong_shape[0]
            parts.append(
                f"{len(wrong_shape)} shape mismatches, e.g. {k!r} is "
                f"{tuple(state[k].shape)} where {model_name} has {tuple(own[k].shape)}"
            )
        raise ModelError(
            f"weights {source} do not fit {model_name} ({'; '.join(parts)}); "
            f"expected a state dict of {model_name}"
        )
    try:
        module.load_state_dict(state, strict=False)  # keys and shapes checked above
    except RuntimeError as exc:
        raise ModelError(f"weights {source} do not fit {model_name}: {short_reason(exc)}") from exc


def _why_unreadable(exc: BaseException) -> str:
    """What a failed `torch.load(weights_only=True)` says, in a few words."""
    code = re.search(r"unsupported GLOBAL (\S+) whose module \S+ is blocked", str(exc))
    if code:
        return f"a pickle that would call {code.group(1)} (refused: weights are data, not code)"
    if "central directory" in str(exc):  # a torch file is a zip: its index is at the end
        return "a damaged torch weights file (cut short?)"
    found = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
    if found:
        return (
            f"a pickled Python object ({found.group(1)}), not a state dict; save "
            "model.state_dict() instead of the model"
        )
    return f"not a torch weights file ({type(exc).__name__})"


def short_reason(exc: BaseException, *, limit: int = 160) -> str:
    """`Type: first line of the message`, cut to `limit` characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""`--compile`: the model through `torch.compile`, and eagerly if it cannot be compiled.

`torch.compile` only wraps the module; the compiler runs on the first call at each input
shape, which in the pipeline is the engine's warm-up: one batch at the rig's size, then one
frame (bench warms its own step up the same way). Those are the two shapes compiled, and
only those: a call with any other shape (a partial batch: a camera ended, late, or
reconnecting) runs eagerly. Compiling another shape in the middle of a run would stall every
camera for as long as a compile takes (about a minute per shape for yolox-nano on the 2-core
development CPU), and shapes cannot share one dynamic graph here: the detectors split their
batch into per-image outputs with `range(batch)`, which pins the batch size. Shapes are
compiled static (`dynamic=False`) for the same reason: a dynamic attempt would only cost a
third compile.

A model the compiler cannot handle must not stop the run. If wrapping raises, or a compiled
call raises and the same batch then runs eagerly, the compiler was at fault: one warning
names the reason, and the model runs eagerly from then on. If the eager call raises too,
the model itself fails on that batch: its own error goes up, as it would without
`--compile` (the engine sets the batch aside), and the compiled model stays.

Not thread-safe: one `CompiledModel` is called by one thread at a time (the engine thread,
or bench's own loop). Dynamo's cache belongs to the module's code, so the several steps
that bench makes over one detector compile it once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)

# What `torch.compile` is given as its backend (tests put a failing one here).
BACKEND: str | Callable[..., Any] = "inductor"
# The input shapes compiled: the warm-up's two (the rig's batch and a single frame).
MAX_SHAPES = 2
_REASON_CHARS = 200


def failure_reason(exc: BaseException) -> str:
    """One line naming what went wrong: the innermost cause's type and first line (dynamo
    wraps the compiler's own error in a long message of its own)."""
    root = exc
    for _ in range(16):  # a cause chain is short; a cycle must not hang us
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if not isinstance(inner, BaseException) or inner is root:
            break
        root = inner
    first = next((line.strip() for line in str(root).splitlines() if line.strip()), "")
    text = f"{type(root).__name__}: {first}" if first else type(root).__name__
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 3] + "..."


class CompiledModel:
    """Calls `model` compiled for the first `MAX_SHAPES` input shapes, eagerly otherwise (see
    the module docstring).

    Args:
        model: the module as the step set it up (device, precision, memory format).
        name: the detector's name, for the warning.
    """

    def __init__(self, model: torch.nn.Module, *, name: str) -> None:
        self.model = model
        self.name = name
        self.shapes: set[tuple[int, ...]] = set()  # shapes compiled (or being compiled)
        self.failure: str | None = None  # why it runs eagerly, once it does
        self._compiled: Callable[..., Any] | None = None
        try:
            self._compiled = torch.compile(model, backend=BACKEND, dynamic=False)
        except Exception as exc:  # no compiler here (e.g. an unsupported Python)
            self._give_up(exc)

    @property
    def compiled(self) -> bool:
        """Whether the compiled model is still in use (False after a fallback)."""
        return self._compiled is not None

    def _give_up(self, exc: BaseException) -> None:
        self._compiled = None
        self.failure = failure_reason(exc)
        log.warning(
            "--compile: model %s cannot be compiled (%s); running it eagerly",
            self.name,
            self.failure,
        )

    def __call__(self, x: torch.Tensor) -> Any:
        compiled = self._compiled
        shape = tuple(x.shape)
        if compiled is None:
            return self.model(x)
        if shape not in self.shapes:
            if len(self.shapes) >= MAX_SHAPES:
                return self.model(x)  # not compiled mid-run (see the module docstring)
            self.shapes.add(shape)
        try:
            return compiled(x)
        except Exception as exc:
            outputs = self.model(x)  # raises when the model itself fails on this batch
            self._give_up(exc)
            return outputs

"""Convolutions with their weights laid out for oneDNN once, on a CPU (torch, float32).

Eager torch hands every convolution call to oneDNN with the weights in torch's own layout, so
oneDNN reorders them into its blocked layout on each call, and some shapes (1x1 heads with a
bias, for one) go to torch's slower im2col path instead. Inductor's freezing packs the weights
once; this does the same without compiling anything, so it works in the CPU lanes and for any
module: each `nn.Conv2d` becomes a `PackedConv2d` whose weight is reordered once
(`torch.ops.mkldnn._reorder_convolution_weight`, for the shapes the sample forward showed it)
and which runs `torch.ops.mkldnn._convolution_pointwise`, the op Inductor's frozen graphs call.
A convolution followed by an eval-mode batch norm and an activation is one call: the norm
folded into the weights, the activation fused into the convolution. Two shapes of that chain
are recognised: three consecutive children of an `nn.Sequential` (torchvision's and
drivepercept-tiny's blocks) and a module whose only children are `conv`, an optional `bn` and
`act` (YOLOX's `BaseConv`, Ultralytics' `Conv`).

Nothing is taken on trust. Every replacement is checked on the input its module received in
a forward of a sample batch, against what the eager module computed on it: a chain module's
own output must equal the chain (else its forward is something else and only its convolution
is packed), and the packed call must match within `TOLERANCE` of the largest value. A
replacement that fails, or a convolution the sample did not reach, stays eager and is named
in the result. The network is copied first: the detector's own module is left as it was (for
export, for another device, for another set-up).

Measured (docs/BENCHMARKS.md, "Packed convolutions"): a batch of three on one thread, thread
CPU eager / packed 1.14-1.17x for bench_peer's YOLOv8n at 320, 1.32x for drivepercept-tiny,
1.02-1.08x for yolox-nano (mostly depthwise convolutions).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TOLERANCE = 1e-4  # of the largest absolute value of the eager output (float32 sums ~1e-6)

# activation module -> (oneDNN post-op name, its scalars, its algorithm)
_ACTIVATIONS: dict[type[nn.Module], Callable[[Any], tuple[str, list[float], str]]] = {
    nn.ReLU: lambda m: ("relu", [], ""),
    nn.SiLU: lambda m: ("swish", [], ""),
    nn.Sigmoid: lambda m: ("sigmoid", [], ""),
    nn.Hardswish: lambda m: ("hardswish", [], ""),
    nn.ReLU6: lambda m: ("hardtanh", [0.0, 6.0], ""),
    nn.LeakyReLU: lambda m: ("leaky_relu", [float(m.negative_slope)], ""),
}


def unavailable(device: torch.device, precision: str) -> str | None:
    """Why packing does not apply here (None where it does): a CPU, float32, and a torch
    build whose oneDNN has the ops."""
    if device.type != "cpu":
        return f"device {device.type}"
    if precision != "fp32":
        return f"precision {precision}"
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return "torch built without oneDNN"
    try:
        torch.ops.mkldnn._convolution_pointwise  # noqa: B018 (looked up: present or not)
        torch.ops.mkldnn._reorder_convolution_weight  # noqa: B018
    except (AttributeError, RuntimeError):
        return "torch's oneDNN has no pointwise convolution op"
    return None


class PackedConv2d(nn.Module):
    """A float32 2-D convolution (with an optional batch norm folded in and an activation
    fused) whose weight is in oneDNN's layout, made once."""

    def __init__(
        self,
        conv: nn.Conv2d,
        *,
        input_shape: list[int],
        norm: nn.BatchNorm2d | None = None,
        activation: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.padding = [int(p) for p in conv.padding]
        self.stride = [int(s) for s in conv.stride]
        self.dilation = [int(d) for d in conv.dilation]
        self.groups = int(conv.groups)
        with torch.no_grad():
            weight = conv.weight.detach().float()
            bias = None if conv.bias is None else conv.bias.detach().float()
            if norm is not None:
                weight, bias = _fold(weight, bias, norm)
            packed = torch.ops.mkldnn._reorder_convolution_weight(
                weight.contiguous(),
                self.padding,
                self.stride,
                self.dilation,
                self.groups,
                input_shape,
            )
        self.register_buffer("weight", packed)
        self.register_buffer("bias", None if bias is None else bias.contiguous())
        self.attr, self.scalars, self.algorithm = (
            _ACTIVATIONS[type(activation)](activation)
            if activation is not None
            else ("none", [], "")
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._convolution_pointwise(
            x,
            self.weight,
            self.bias,
            self.padding,
            self.stride,
            self.dilation,
            self.groups,
            self.attr,
            self.scalars,
            self.algorithm,
        )
        return out

    def extra_repr(self) -> str:
        return f"stride={self.stride}, padding={self.padding}, groups={self.groups}, {self.attr}"


def _fold(
    weight: torch.Tensor, bias: torch.Tensor | None, norm: nn.BatchNorm2d
) -> tuple[torch.Tensor, torch.Tensor]:
    """An eval-mode batch norm folded into the convolution before it."""
    assert norm.running_mean is not None and norm.running_var is not None
    scale = torch.rsqrt(norm.running_var.float() + norm.eps)
    if norm.weight is not None:
        scale = scale * norm.weight.detach().float()
    shift = -norm.running_mean.float() * scale
    if norm.bias is not None:
        shift = shift + norm.bias.detach().float()
    base = bias if bias is not None else torch.zeros_like(shift)
    return weight * scale.view(-1, 1, 1, 1), base * scale + shift


@dataclass(frozen=True)
class PrepackResult:
    """What packing did to a network.

    Attributes:
        model: the network to run (a copy; the original where nothing was packed).
        total: the `nn.Conv2d` in the network.
        packed: those now packed; fused: of them, with a norm or activation folded in.
        kept: the ones left eager, each as "name: why".
    """

    model: nn.Module
    total: int
    packed: int
    fused: int
    kept: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the log and the run record."""
        text = f"{self.packed} of {self.total} convolutions packed for oneDNN"
        text += f" ({self.fused} with their norm or activation fused)"
        return text + (f"; eager: {', '.join(self.kept)}" if self.kept else "")


@dataclass
class _Chain:
    """A convolution and what follows it, where those sit, and what the sample showed."""

    conv: nn.Conv2d
    norm: nn.BatchNorm2d | None
    act: nn.Module | None
    owner: nn.Module | None  # the conv/bn/act module, checked on its own output; None: Sequential
    # where the norm and the activation sit (parent, attribute): a module object may be shared
    # (Ultralytics' Conv blocks share one SiLU), so only these places are replaced
    places: tuple[tuple[nn.Module, str], ...] = ()
    packed: PackedConv2d | None = None  # the checked replacement
    failed: bool = False
    confirmed: bool = False  # the owner's own output was the chain's
    seen: torch.Tensor | None = None  # an owner's conv input and the packed output, until
    made: torch.Tensor | None = None  # the owner's own output has been compared

    @property
    def fuses(self) -> bool:
        return self.norm is not None or self.act is not None

    def unfuse(self) -> None:
        self.norm = self.act = self.owner = None


def prepack_convolutions(
    model: nn.Module, sample: torch.Tensor, *, batch: int | None = None
) -> PrepackResult:
    """`model` (eval mode, float32, on the CPU) with its convolutions packed for inputs of
    `batch` frames (the sample's by default), each one checked on what it received in
    `model(sample)`; see the module docstring."""
    convs = [m for m in model.modules() if type(m) is nn.Conv2d]
    if not convs:
        return PrepackResult(model=model, total=0, packed=0, fused=0)
    try:
        model = copy.deepcopy(model)
    except Exception as exc:  # a plugin's module may hold what cannot be copied
        why = f"all: the network cannot be copied ({exc})"
        return PrepackResult(model, len(convs), 0, 0, (why,))
    names = {m: name for name, m in model.named_modules()}
    chains = _chains(model)
    frames = batch or int(sample.shape[0])
    hooks = [c.conv.register_forward_hook(_conv_hook(c, frames)) for c in chains.values()]
    hooks += [
        chain.owner.register_forward_hook(_owner_hook(chain))
        for chain in chains.values()
        if chain.owner is not None
    ]
    try:
        with torch.no_grad():
            model(sample)
    finally:
        for hook in hooks:
            hook.remove()
    kept: list[str] = []
    packed = fused = 0
    sites: dict[nn.Module, list[tuple[nn.Module, str]]] = {}
    for parent in model.modules():
        for name, child in parent.named_children():
            sites.setdefault(child, []).append((parent, name))
    for conv, chain in chains.items():
        if chain.packed is None:
            why = "differs from eager" if chain.failed else "not reached by the sample"
            kept.append(f"{names.get(conv, '?')}: {why}")
            continue
        if chain.owner is not None and not chain.confirmed:
            kept.append(f"{names.get(conv, '?')}: its block was not called")
            continue
        for parent, name in sites.get(conv, []):
            setattr(parent, name, chain.packed)
        # the fused norm and activation become Identity in the chain's own places (the
        # blocks stay: their parents may read their other attributes or index them)
        for parent, name in chain.places if chain.fuses else ():
            setattr(parent, name, nn.Identity())
        packed += 1
        fused += int(chain.fuses)
    return PrepackResult(model, len(convs), packed, fused, tuple(kept))


def _chains(model: nn.Module) -> dict[nn.Conv2d, _Chain]:
    """Each plain convolution, with the norm and activation that follow it where the
    network's shape says so."""
    chains: dict[nn.Conv2d, _Chain] = {}
    for module in model.modules():
        if isinstance(module, nn.Sequential):
            children = list(module)
            for i, child in enumerate(children):
                if type(child) is nn.Conv2d and child not in chains:
                    norm, act = _followers(children[i + 1 : i + 3])
                    places: tuple[tuple[nn.Module, str], ...] = tuple(
                        (module, str(j))
                        for j in range(i + 1, min(i + 3, len(children)))
                        if children[j] is norm or children[j] is act
                    )
                    chains[child] = _Chain(child, norm, act, owner=None, places=places)
        conv = getattr(module, "conv", None)
        if type(conv) is nn.Conv2d and conv not in chains:
            extra = {n for n, _ in module.named_children()} - {"conv", "bn", "act"}
            bn, act = getattr(module, "bn", None), getattr(module, "act", None)
            norm, fused_act = _followers([m for m in (bn, act) if m is not None])
            bn_ok = bn is None or norm is not None or isinstance(bn, nn.Identity)
            act_ok = act is None or fused_act is not None or isinstance(act, nn.Identity)
            if not extra and bn_ok and act_ok and (norm is not None or fused_act is not None):
                own: tuple[tuple[nn.Module, str], ...] = tuple(
                    (module, n) for n, m in (("bn", norm), ("act", fused_act)) if m is not None
                )
                chains[conv] = _Chain(conv, norm, fused_act, owner=module, places=own)
    for module in model.modules():
        if type(module) is nn.Conv2d and module not in chains:
            chains[module] = _Chain(module, None, None, owner=None)
    return {c: chain for c, chain in chains.items() if _packable(c)}


def _followers(modules: list[nn.Module]) -> tuple[nn.BatchNorm2d | None, nn.Module | None]:
    """The eval-mode batch norm and the fusable activation among the (up to two) modules
    after a convolution, in that order."""
    norm: nn.BatchNorm2d | None = None
    rest = iter(modules)
    first = next(rest, None)
    if type(first) is nn.BatchNorm2d and not first.training and first.track_running_stats:
        norm = first
        first = next(rest, None)
    elif isinstance(first, nn.Identity):
        first = next(rest, None)
    act = first if first is not None and type(first) in _ACTIVATIONS else None
    return norm, act


def _packable(conv: nn.Conv2d) -> bool:
    return (
        conv.padding_mode == "zeros"
        and not isinstance(conv.padding, str)
        and conv.weight.dtype == torch.float32
        and conv.weight.device.type == "cpu"
    )


def _conv_hook(chain: _Chain, frames: int) -> Callable[..., None]:
    """Packs the chain (or, where that differs, the convolution alone) for the first call's
    input shape, and checks it on every call's input."""

    def hook(conv: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        if chain.failed:
            return
        x = inputs[0]
        shape = [frames, *x.shape[1:]]
        if chain.fuses:
            packed = chain.packed or PackedConv2d(
                chain.conv, input_shape=shape, norm=chain.norm, activation=chain.act
            )
            made = packed(x)
            if _close(made, _run_chain(chain, output.clone())):
                chain.packed = packed
                if chain.owner is not None:
                    chain.seen, chain.made = x, made
                return
            chain.unfuse()
            chain.packed = None
        _check_plain(chain, x, output, shape)

    return hook


def _owner_hook(chain: _Chain) -> Callable[..., None]:
    """A conv/bn/act module's own output must be the chain's, else its forward is something
    else: then only its convolution is packed."""

    def hook(owner: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
        x, made = chain.seen, chain.made
        chain.seen = chain.made = None
        if chain.owner is None or chain.failed or x is None or made is None:
            return
        if isinstance(output, torch.Tensor) and _close(made, output):
            chain.confirmed = True
            return
        chain.unfuse()
        chain.packed = None
        _check_plain(chain, x, chain.conv.forward(x), [made.shape[0], *x.shape[1:]])

    return hook


def _check_plain(chain: _Chain, x: torch.Tensor, want: torch.Tensor, shape: list[int]) -> None:
    packed = chain.packed or PackedConv2d(chain.conv, input_shape=shape)
    if _close(packed(x), want):
        chain.packed = packed
    else:
        chain.packed = None
        chain.failed = True


def _run_chain(chain: _Chain, conv_out: torch.Tensor) -> torch.Tensor:
    out = conv_out
    if chain.norm is not None:
        out = chain.norm(out)
    if chain.act is not None:
        out = chain.act(out.clone())  # an in-place activation must not change what it was given
    return out


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    if got.shape != want.shape:
        return False
    scale = float(want.abs().max()) if want.numel() else 0.0
    return bool(torch.allclose(got, want, rtol=0.0, atol=TOLERANCE * max(scale, 1.0)))


def iter_packed(model: nn.Module) -> Iterator[PackedConv2d]:
    """The packed convolutions of a network."""
    return (m for m in model.modules() if isinstance(m, PackedConv2d))

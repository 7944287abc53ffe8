"""Packed convolutions (`engine/prepack.py`): the same outputs as eager, every replacement
checked, nothing fused that the network's own forward does not compute."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from drivepercept.config import PipelineConfig
from drivepercept.engine.prepack import (
    PackedConv2d,
    iter_packed,
    prepack_convolutions,
    unavailable,
)
from drivepercept.engine.step import DetectorStep
from drivepercept.models.registry import load_detector

pytestmark = pytest.mark.skipif(
    unavailable(torch.device("cpu"), "fp32") is not None, reason="torch without oneDNN's ops"
)


def _flat(out: object) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out.flatten().float()
    if isinstance(out, dict):
        return torch.cat([_flat(v) for v in out.values()])
    assert isinstance(out, (list, tuple))
    return torch.cat([_flat(v) for v in out])


def _same(a: nn.Module, b: nn.Module, x: torch.Tensor) -> float:
    with torch.inference_mode():
        want, got = _flat(a(x)), _flat(b(x))
    return float((want - got).abs().max() / want.abs().max().clamp(min=1.0))


class _Block(nn.Module):
    """conv, bn, act children, as YOLOX's BaseConv and Ultralytics' Conv have them."""

    def __init__(self, c_in: int, c_out: int, act: nn.Module, *, residual: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.act = act
        self.residual = residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.act(self.bn(self.conv(x)))
        return out + x if self.residual else out  # residual: not the chain the names suggest


def _randomise_norms(model: nn.Module) -> nn.Module:
    """Norm statistics far from the identity, so that folding them is really tested."""
    gen = torch.Generator().manual_seed(3)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            assert m.running_mean is not None and m.running_var is not None
            m.running_mean.copy_(torch.randn(n, generator=gen))
            m.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            if m.affine:
                m.weight.data.copy_(torch.randn(n, generator=gen))
                m.bias.data.copy_(torch.randn(n, generator=gen))
    return model.eval()


def test_a_chain_is_fused_and_a_block_whose_forward_differs_is_not() -> None:
    shared = nn.SiLU(inplace=True)  # one activation object in two blocks, as Ultralytics has
    model = _randomise_norms(
        nn.Sequential(
            _Block(3, 8, shared),
            _Block(8, 8, shared, residual=True),
            nn.Conv2d(8, 8, 1),
            nn.BatchNorm2d(8, affine=False),
            nn.LeakyReLU(0.2),
            nn.Conv2d(8, 4, 3, 2, 1, groups=4),
            nn.ReLU6(),
        )
    )
    x = torch.randn(2, 3, 32, 40)
    result = prepack_convolutions(model, x[:1], batch=2)
    assert (result.total, result.packed, result.kept) == (4, 4, ())
    assert result.fused == 3  # block 0, the 1x1 with its norm and leaky ReLU, the grouped one
    packed = result.model
    assert isinstance(packed, nn.Sequential)
    assert isinstance(packed[0].act, nn.Identity) and isinstance(packed[0].bn, nn.Identity)
    # block 1 adds its input: its norm and activation stay where they are, and the shared
    # SiLU is not taken away from it because block 0's was fused
    assert isinstance(packed[1].act, nn.SiLU) and isinstance(packed[1].bn, nn.BatchNorm2d)
    assert isinstance(packed[1].conv, PackedConv2d) and packed[1].conv.attr == "none"
    assert [m.attr for m in (packed[2], packed[5])] == ["leaky_relu", "hardtanh"]
    assert _same(model, packed, x) < 1e-5
    assert len(list(iter_packed(model))) == 0  # the original network is left as it was


def test_a_convolution_the_sample_does_not_reach_stays_eager() -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used = nn.Conv2d(3, 4, 3, padding=1)
            self.spare = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.used(x)
            return out

    result = prepack_convolutions(Branchy().eval(), torch.randn(1, 3, 16, 16))
    assert (result.packed, result.kept) == (1, ("spare: not reached by the sample",))
    assert type(result.model.spare) is nn.Conv2d
    assert "1 of 2 convolutions packed" in result.describe()


def test_what_packing_does_not_apply_to() -> None:
    assert unavailable(torch.device("cuda"), "fp32") == "device cuda"
    assert unavailable(torch.device("cpu"), "bf16") == "precision bf16"
    reflect = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")).eval()
    result = prepack_convolutions(reflect, torch.randn(1, 3, 8, 8))
    assert (result.total, result.packed) == (1, 0)
    assert prepack_convolutions(nn.ReLU(), torch.randn(1, 3, 8, 8)).total == 0


@pytest.mark.parametrize(("name", "size"), [("drivepercept-tiny", None), ("yolox-nano", (160, 96))])
def test_bundled_models_give_eager_outputs(name: str, size: tuple[int, int] | None) -> None:
    detector = load_detector(name, weights="none", input_size=size)
    model = _randomise_norms(detector.module.eval())
    w, h = detector.input.size
    x = torch.rand(3, 3, h, w).contiguous(memory_format=torch.channels_last)
    result = prepack_convolutions(model, x[:1], batch=3)
    assert result.packed == result.total > 0 and not result.kept
    assert result.fused > result.total // 2
    # the raw maps: the decoded boxes pick peaks, and a flat random-weight heat map has ties
    # that a rounding difference of 1e-7 breaks the other way
    method = "maps" if name == "drivepercept-tiny" else "raw"
    with torch.inference_mode():
        want = _flat(getattr(model, method)(x))
        got = _flat(getattr(result.model, method)(x))
    assert float((want - got).abs().max() / want.abs().max().clamp(min=1.0)) < 1e-4


def test_the_step_packs_on_a_cpu_and_gives_the_eager_boxes() -> None:
    detector = load_detector("drivepercept-tiny", weights="DEFAULT")
    frames = torch.from_numpy(
        __import__("numpy").random.default_rng(5).integers(0, 256, (4, 256, 448, 3), "uint8")
    )
    on = DetectorStep(detector, PipelineConfig(device="cpu"), torch.device("cpu"), max_batch=4)
    off_config = PipelineConfig(device="cpu", cpu_prepack=False)
    off = DetectorStep(detector, off_config, torch.device("cpu"), max_batch=4)
    try:
        assert on.packing.startswith("22 of 22 convolutions packed") and off.packing == "off"
        assert any(isinstance(m, PackedConv2d) for m in on.model.modules())
        assert not any(isinstance(m, PackedConv2d) for m in detector.module.modules())
        (boxes_on, counts_on), (boxes_off, counts_off) = on(frames), off(frames)
        assert torch.equal(counts_on, counts_off) and int(counts_on.sum()) > 0
        assert torch.allclose(boxes_on, boxes_off, atol=1e-2)  # pixels and scores
    finally:
        on.close()
        off.close()
    bf16 = DetectorStep(
        detector, PipelineConfig(device="cpu", precision="bf16"), torch.device("cpu")
    )
    assert bf16.packing == "precision bf16"


def test_a_block_whose_convolution_is_called_alone_is_not_fused() -> None:
    class Skips(nn.Module):
        """Calls its block's convolution directly: the block's activation never runs."""

        def __init__(self) -> None:
            super().__init__()
            self.block = _Block(3, 4, nn.ReLU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.block.conv(x)
            return out

    model = _randomise_norms(Skips())
    x = torch.randn(1, 3, 16, 16)
    result = prepack_convolutions(model, x)
    assert result.fused == 0 and result.kept == ("block.conv: its block was not called",)
    assert _same(model, result.model, x) == 0.0

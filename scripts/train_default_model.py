"""Train the bundled detector (`drivepercept-tiny`) from scratch on the synthetic rig.

Frames and ground truth are rendered by `drivepercept.sim` at the start (many seeds, all six
default cameras at 640x360, every lighting preset the seeds draw), letterboxed to the model's
input exactly as the pipeline does, and kept in memory. Training is CenterNet's: a focal loss
on the centre heat maps and L1 losses on box size and offset. Hidden (visibility < 0.3) or
tiny (< 8 px tall) objects are neither positives nor negatives. A held-out validation clip
(its own seed) is scored with the project's COCO evaluation as training goes.

Deterministic given --seed (same data, same initialisation, same batches) on one machine.

    python scripts/train_default_model.py --steps 3500 --out models/drivepercept_tiny.pt
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from drivepercept.eval import EvalThresholds, score_detections
from drivepercept.models import tiny
from drivepercept.sim.camera import CameraModel, default_rig_cameras
from drivepercept.sim.render import Renderer
from drivepercept.sim.world import generate_world
from drivepercept.sources.prepare import prepare
from drivepercept.types import Letterbox

log = logging.getLogger("train")

MIN_VISIBILITY = 0.3
MIN_HEIGHT_PX = 8.0
VAL_SEED = 9000  # validation clip; the held-out test clip of the tests and note is 9001
TRAIN_SEED_BASE = 100_000


@dataclass
class Sample:
    image: npt.NDArray[np.uint8]  # (H, W, 3) RGB at the model input size
    boxes: npt.NDArray[np.float32]  # (N, 4) input pixels, positives
    labels: npt.NDArray[np.int64]  # (N,)
    ignore: npt.NDArray[np.float32]  # (M, 4) input pixels
    camera: str
    frame_index: int
    letterbox: Letterbox
    gt: list[dict[str, Any]]  # original-pixel annotations (for validation)


def render_samples(
    seeds: list[int], *, instants: int, spacing_s: float, noise_seed: int
) -> list[Sample]:
    """Render every default camera at `instants` times per seed."""
    cams = [CameraModel.from_config(c) for c in default_rig_cameras(6, width=640, height=360)]
    spec = tiny.input_spec()
    samples = []
    for seed in seeds:
        world = generate_world(seed, duration_s=instants * spacing_s + 1.0)
        renderer = Renderer(world, cams, noise_seed=noise_seed + seed)
        for k in range(instants):
            for view in renderer.render(k * spacing_s + 0.25, frame_index=k):
                image, box = prepare(np.ascontiguousarray(view.image), spec)
                pos: list[npt.NDArray[np.float32]] = []
                ign: list[npt.NDArray[np.float32]] = []
                labels: list[int] = []
                gt: list[dict[str, Any]] = []
                for b in view.boxes:
                    h = b.xyxy[3] - b.xyxy[1]
                    keep = b.visibility >= MIN_VISIBILITY and h >= MIN_HEIGHT_PX
                    mapped = box.to_input(np.array([b.xyxy], np.float32))[0]
                    (pos if keep else ign).append(mapped)
                    if keep:
                        labels.append(int(b.category) - 1)
                    gt.append(
                        {
                            "bbox": [b.xyxy[0], b.xyxy[1], b.xyxy[2] - b.xyxy[0], h],
                            "category_id": int(b.category),
                            "visibility": b.visibility,
                        }
                    )
                samples.append(
                    Sample(
                        image=image,
                        boxes=np.array(pos, np.float32).reshape(-1, 4),
                        labels=np.array(labels, np.int64),
                        ignore=np.array(ign, np.float32).reshape(-1, 4),
                        camera=view.camera,
                        frame_index=seed * 100 + k,
                        letterbox=box,
                        gt=gt,
                    )
                )
    return samples


def targets(samples: list[Sample], flips: npt.NDArray[np.bool_]) -> dict[str, torch.Tensor]:
    """CenterNet training targets at stride 4 (TTFNet-style elliptical Gaussians)."""
    w_in, h_in = tiny.INPUT_SIZE
    ow, oh = w_in // tiny.STRIDE, h_in // tiny.STRIDE
    n, c = len(samples), len(tiny.CLASSES)
    heat = np.zeros((n, c, oh, ow), np.float32)
    size = np.zeros((n, 2, oh, ow), np.float32)
    offset = np.zeros((n, 2, oh, ow), np.float32)
    mask = np.zeros((n, oh, ow), np.float32)
    weight = np.ones((n, oh, ow), np.float32)
    ys, xs = np.mgrid[0:oh, 0:ow].astype(np.float32)
    for i, s in enumerate(samples):
        boxes, ignore = s.boxes.copy(), s.ignore.copy()
        if flips[i]:
            for b in (boxes, ignore):
                b[:, [0, 2]] = w_in - b[:, [2, 0]]
        for x0, y0, x1, y1 in ignore / tiny.STRIDE:
            weight[i, max(int(y0), 0) : math.ceil(y1), max(int(x0), 0) : math.ceil(x1)] = 0
        order = np.argsort(-(boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]))
        for j in order:  # large first, so small objects win shared centre cells
            x0, y0, x1, y1 = boxes[j]
            bw, bh = max(x1 - x0, 1.0), max(y1 - y0, 1.0)
            cx, cy = (x0 + x1) / 2 / tiny.STRIDE, (y0 + y1) / 2 / tiny.STRIDE
            ix, iy = min(max(int(cx), 0), ow - 1), min(max(int(cy), 0), oh - 1)
            sx = max(0.54 * bw / tiny.STRIDE / 6, 0.5)
            sy = max(0.54 * bh / tiny.STRIDE / 6, 0.5)
            g = np.exp(-((xs - ix) ** 2 / (2 * sx * sx) + (ys - iy) ** 2 / (2 * sy * sy)))
            k = int(s.labels[j])
            np.maximum(heat[i, k], g, out=heat[i, k])
            size[i, :, iy, ix] = (math.log(bw), math.log(bh))
            offset[i, :, iy, ix] = (cx - ix, cy - iy)
            mask[i, iy, ix] = 1.0
            weight[
                i,
                max(int(y0 / tiny.STRIDE), 0) : math.ceil(y1 / tiny.STRIDE),
                max(int(x0 / tiny.STRIDE), 0) : math.ceil(x1 / tiny.STRIDE),
            ] = 1.0
    return {
        k: torch.from_numpy(v)
        for k, v in (
            ("heat", heat),
            ("size", size),
            ("offset", offset),
            ("mask", mask),
            ("weight", weight),
        )
    }


def loss_fn(
    heat_logits: torch.Tensor, size: torch.Tensor, offset: torch.Tensor, t: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, dict[str, float]]:
    pred = heat_logits.sigmoid().clamp(1e-4, 1 - 1e-4)
    gt = t["heat"]
    pos = gt.eq(1.0).float()
    neg_w = (1 - gt).pow(4) * t["weight"].unsqueeze(1)
    pos_loss = (torch.log(pred) * (1 - pred).pow(2) * pos).sum()
    neg_loss = (torch.log(1 - pred) * pred.pow(2) * neg_w * (1 - pos)).sum()
    n_pos = pos.sum().clamp(min=1.0)
    focal = -(pos_loss + neg_loss) / n_pos
    m = t["mask"].unsqueeze(1)
    n = m.sum().clamp(min=1.0)
    size_l = (F.l1_loss(size, t["size"], reduction="none") * m).sum() / n
    off_l = (F.l1_loss(offset, t["offset"], reduction="none") * m).sum() / n
    total = focal + 0.5 * size_l + off_l
    parts = {
        "focal": float(focal.detach()),
        "size": float(size_l.detach()),
        "offset": float(off_l.detach()),
    }
    return total, parts


def to_batch(
    samples: list[Sample], flips: npt.NDArray[np.bool_], gains: npt.NDArray[np.float32]
) -> torch.Tensor:
    images = np.stack(
        [s.image[:, ::-1] if f else s.image for s, f in zip(samples, flips, strict=True)]
    )
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
    x = (x * torch.from_numpy(gains).view(-1, 1, 1, 1)).clamp(0.0, 1.0)
    mean = torch.tensor(tiny.MEAN).view(1, 3, 1, 1)
    std = torch.tensor(tiny.STD).view(1, 3, 1, 1)
    return ((x - mean) / std).contiguous(memory_format=torch.channels_last)


def validate(model: torch.nn.Module, samples: list[Sample]) -> dict[str, Any]:
    """COCO mAP on the validation samples, through the project's own evaluation."""
    model.eval()
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    frames: list[dict[str, Any]] = []
    ann_id = 0
    with torch.inference_mode():
        for start in range(0, len(samples), 12):
            chunk = samples[start : start + 12]
            x = to_batch(chunk, np.zeros(len(chunk), bool), np.ones(len(chunk), np.float32))
            outputs = model(x)
            for s, out in zip(chunk, outputs, strict=True):
                img_id = len(images) + 1
                images.append(
                    {
                        "id": img_id,
                        "camera": s.camera,
                        "frame_index": s.frame_index,
                        "width": 640,
                        "height": 360,
                    }
                )
                for g in s.gt:
                    ann_id += 1
                    annotations.append(
                        {
                            **g,
                            "id": ann_id,
                            "image_id": img_id,
                            "iscrowd": 0,
                            "area": g["bbox"][2] * g["bbox"][3],
                        }
                    )
                keep = out["scores"] >= 0.05
                boxes = s.letterbox.to_original(out["boxes"][keep].numpy())
                frames.append(
                    {
                        "camera": s.camera,
                        "frame_index": s.frame_index,
                        "boxes": boxes.tolist(),
                        "scores": out["scores"][keep].tolist(),
                        "class_names": [tiny.CLASSES[i] for i in out["labels"][keep]],
                    }
                )
    gt = {
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": n} for i, n in enumerate(tiny.CLASSES)],
    }
    report = score_detections(gt, frames, thresholds=EvalThresholds())
    model.train()
    return {
        "map_50": report.map_50,
        "map_50_95": report.map_50_95,
        "per_class_ap_50": {k: round(v["ap_50"], 3) for k, v in report.per_class.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--train-seeds", type=int, default=150, help="worlds to render")
    parser.add_argument("--instants", type=int, default=5, help="rig frames per world")
    parser.add_argument("--val-every", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        help="where to save the state dict (the bundled one is models/drivepercept_tiny.pt)",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.manual_seed(args.seed)
    torch.set_num_threads(2)
    rng = np.random.default_rng(args.seed)

    t0 = time.perf_counter()
    seeds = [TRAIN_SEED_BASE + args.seed * 10_000 + i for i in range(args.train_seeds)]
    train = render_samples(seeds, instants=args.instants, spacing_s=1.7, noise_seed=args.seed)
    val = render_samples([VAL_SEED], instants=4, spacing_s=2.0, noise_seed=7)
    log.info(
        "rendered %d training and %d validation images in %.0f s",
        len(train),
        len(val),
        time.perf_counter() - t0,
    )

    model = tiny.TinyCenterNet().to(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    warmup = min(200, int(args.steps) // 10)

    base_lr = float(args.lr)

    def lr_at(step: int) -> float:
        if step < warmup:
            return base_lr * (step + 1) / warmup
        p = (step - warmup) / max(1, args.steps - warmup)
        return base_lr * 0.5 * (1 + math.cos(math.pi * p))

    order = rng.permutation(len(train))
    cursor = 0
    running: dict[str, float] = {}
    for step in range(args.steps):
        if cursor + args.batch > len(order):
            order, cursor = rng.permutation(len(train)), 0
        batch = [train[i] for i in order[cursor : cursor + args.batch]]
        cursor += args.batch
        flips = rng.random(len(batch)) < 0.5
        gains = rng.uniform(0.75, 1.25, len(batch)).astype(np.float32)
        x = to_batch(batch, flips, gains)
        t = targets(batch, flips)
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        heat, size, offset = model(x)
        loss, parts = loss_fn(heat, size, offset, t)
        opt.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        for k, v in {"loss": float(loss.detach()), **parts}.items():
            running[k] = 0.98 * running.get(k, v) + 0.02 * v
        if step % 50 == 0:
            log.info(
                "step %d/%d lr %.2e %s (%.0f s)",
                step,
                args.steps,
                lr_at(step),
                " ".join(f"{k} {v:.3f}" for k, v in running.items()),
                time.perf_counter() - t0,
            )
        if (step + 1) % args.val_every == 0 or step + 1 == args.steps:
            log.info("validation after %d steps: %s", step + 1, validate(model, val))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            state = {k: v.contiguous() for k, v in model.state_dict().items()}
            torch.save(state, args.out)
            log.info("saved %s", args.out)
    log.info("done in %.0f s", time.perf_counter() - t0)


if __name__ == "__main__":
    main()

"""The argparse front door: subcommands, their flags and worked examples."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any, NoReturn

from drivepercept import __version__
from drivepercept.choices import BENCH_MODES, DEFAULT_MODEL, QUANT_FORMATS

EXIT_USAGE = 2


def real(text: str) -> float:
    """A number flag's value: `float`'s reading, without inf and nan (no setting means them)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


EXAMPLES = {
    "simulate": """
  drivepercept simulate --out /tmp/rig --cameras 6 --seconds 4 --fps 15 --size 640x360 --seed 7
  drivepercept simulate --out /tmp/drive --format mcap   # one drive.mcap (ROS 2, Foxglove)
  drivepercept simulate --out /tmp/long --preset crossing   # 30 s: bends, overtaking traffic
Writes <camera>.mp4 per camera, ground_truth.json (the same seed, the same bytes), rig.toml.""",
    "replay": """
  drivepercept replay sample_videos/rig.toml --model ssdlite320_mobilenet_v3_large --weights none
  drivepercept replay front.mp4 rear.mp4 --device cuda --precision fp16 --save-video
  drivepercept replay --config replay.toml sample_videos/rig.toml   # flags override the file
  drivepercept replay sample_videos/rig.toml --runtime torch   # default auto: ONNX Runtime on CPU
SOURCE: a rig file, a video, an image folder or NAME=SOURCE; several make one rig.""",
    "live": """
  drivepercept serve-cameras sample_videos/rig.toml --port 8554 &   # simulated cameras
  drivepercept live --camera front=http://127.0.0.1:8554/front.mjpg --duration 30
  drivepercept live --camera dash=0 --device cuda --precision fp16 --metrics-port 9100
Newest frame wins (drops counted); a failing camera reconnects while the others carry on.""",
    "eval": """
  drivepercept simulate --out /tmp/heldout --seed 9001 --seconds 4
  drivepercept eval /tmp/heldout --model ssdlite320_mobilenet_v3_large --weights DEFAULT
  drivepercept eval MOT17-02-FRCNN   # a MOTChallenge sequence: seqinfo.ini, gt/gt.txt, img1/
  drivepercept eval kitti/kitti_infos_mono3d.coco.json   # COCO json; images below its folder
Ground truth less visible than --min-visibility or lower than --min-height-px is ignored.""",
    "bench": """
  drivepercept bench sample_videos/rig.toml --model ssdlite320_mobilenet_v3_large --weights none
  drivepercept bench sample_videos/rig.toml --mode ceiling --json ceiling.json
  drivepercept bench sample_videos/rig.toml --mode live --fps 15 --duration 15
  drivepercept bench --mode capacity --fps 30 --budget-ms 100 --size 640x360
  drivepercept bench --sweep --precisions fp32,bf16 --timeouts-ms 5,50 --json sweep.json
default: frames/s of the model alone (the ceiling), the pipeline and a naive loop, with ratios;
ceiling: per batch size; live: served cameras; capacity: most cameras in budget;
sweep: served cameras per precision x batch timeout x cameras (table, plot, JSON).""",
    "fleet": """
  drivepercept fleet /data/drives/*/rig.toml --out /data/fleet-out --device cuda
  drivepercept fleet drives.txt --out out --address auto --resume   # one DRIVE per line
A DRIVE is a rig file or a folder of camera files; out/<drive>/ each, out/_fleet/fleet.html.""",
    "serve-cameras": """
  drivepercept serve-cameras sample_videos/rig.toml --port 8554
Each camera is at http://127.0.0.1:PORT/<name>.mjpg; runs until Ctrl-C or SIGTERM.""",
    "export": """
  drivepercept export --model yolox-nano --input 448x256 --batch dynamic --out yolox.onnx
Writes the ONNX file and its sidecar (yolox.toml: layout, classes, preparation) beside it.""",
    "quantize": """
  drivepercept quantize tiny.onnx --calibrate sample_videos/rig.toml --frames 96 --out int8.onnx
SOURCE: rig, video or image folder; its frames prepared as the pipeline prepares them.""",
    "report": """
  drivepercept report runs/replay-20261130-101500 --budget-ms 66
  drivepercept report runs/fp32 --compare runs/fp16
A killed run or corrupt lines still get a report of what is there (exit 1, problems named).""",
}


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: 'drivepercept simulate: error: ...'."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _flags(p: argparse.ArgumentParser, *specs: tuple[str, Any, str]) -> None:
    """(flag, type or action, help) triples: typed values, or "on/off" switches."""
    for flag, kind, help_text in specs:
        if kind == "switch":
            p.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif kind == "store_true":
            p.add_argument(flag, action="store_true", help=help_text)
        elif kind == "const":
            p.add_argument(flag, action="store_const", const=True, help=help_text)
        else:
            p.add_argument(flag, type=kind, help=help_text)


def _model_args(p: argparse.ArgumentParser, what: str = "SOURCE") -> None:
    p.add_argument("sources", nargs="*", metavar=what, help="rig.toml, video, folder, ...")
    _flags(
        p,
        ("--rig", str, "a rig file (same as giving it as a SOURCE)"),
        ("--config", Path, "TOML file with the same keys as the flags"),
        ("--model", str, f"name or pkg.module:factory (default: rig's, else {DEFAULT_MODEL})"),
        ("--weights", str, "DEFAULT (bundled / downloaded), a .pth/.onnx path, or none"),
        ("--classes", str, "driving (COCO mapped onto driving classes, default) or all"),
        ("--input-size", str, "WxH, x32 (nano 512x288 on CPU, 416x256 on GPU; s-x 640x384)"),
        ("--onnx-layout", str, ".onnx model: yolox, yolov8 or end2end (over its sidecar)"),
        ("--onnx-batch", str, ".onnx batch-1 export: loop over a batch or refuse (sidecar's)"),
        ("--trt-cache", Path, ".onnx on TensorRT: engine cache folder (<stem>.trt-cache)"),
        ("--runtime", str, "auto (ORT on CPU, OpenVINO for bf16), torch, onnxruntime, openvino"),
        ("--onnx-cache", Path, "cached exports of --runtime auto (~/.cache/drivepercept/onnx)"),
        ("--device", str, "auto, cpu, cuda or cuda:N (default auto)"),
        ("--batch-timeout-ms", real, "partial batch after this wait (default 20)"),
        ("--precision", str, "fp32, fp16 or bf16 (default fp32)"),
        ("--channels-last", "switch", "NHWC memory format for the model (default on)"),
        ("--warmup", "switch", "a full and a one-frame batch before capture (default on)"),
        ("--compile", "switch", "torch.compile the model in the warm-up (default off)"),
        ("--cuda-graphs", "switch", "replay the full batch as one CUDA graph (default off)"),
        ("--torch-threads", int, "the model's threads, torch or ORT (default 0: one per core)"),
        ("--cpu-lanes", int, "CPU: sub-batches run at once (default 0: one per torch thread)"),
        ("--cpu-prepack", "switch", "CPU fp32: convolutions packed for oneDNN (default on)"),
        ("--score-threshold", real, "default 0.3"),
        ("--detect-every", int, "the model sees every N-th frame, tracking the rest (default 1)"),
        ("--queue-capacity", int, "frames waiting per camera (default 4; live 1)"),
        ("--max-frames", int, "stop each camera after N frames"),
        ("--sample-hz", real, "GPU/CPU load samples per second, 0 = off (default 10)"),
        ("--drain-timeout-s", real, "after a stop, frames in flight may take this long (10)"),
        ("--no-progress", "store_true", "no progress bar"),
    )


def _run_args(p: argparse.ArgumentParser) -> None:
    _flags(
        p,
        ("--out", Path, "folder for run folders (default runs/)"),
        ("--name", str, "run folder name (default <mode>-<date>-<time>)"),
        ("--save-video", "const", "also write annotated videos, one per camera"),
        ("--mosaic", "const", "with --save-video: one tiled video of all cameras"),
        ("--budget-ms", real, "p99 latency budget: live/--realtime hold it (report's: 100)"),
        ("--no-schedule", "store_true", "--budget-ms marks the report only: nothing held"),
        ("--priority", str, "with a budget: NAME=P,... camera priorities (rig's, default 1)"),
        ("--report", str, "report files: html,json,csv,trace (default all)"),
        ("--duration", real, "stop after this many seconds"),
        ("--show", "store_true", "a live window with every camera (q to stop)"),
        ("--metrics-port", int, "serve Prometheus metrics on http://127.0.0.1:PORT/metrics"),
        ("--metrics-linger-s", real, "keep /metrics up this long after the run (default 0)"),
        ("--reconnect-initial-s", real, "live: first wait before reconnecting (0.25)"),
        ("--reconnect-max-s", real, "live: longest wait between attempts (4)"),
        ("--reconnect-attempts", int, "live: failures in a row before giving up, 0 = never (8)"),
        ("--open-timeout-s", real, "live: how long one connection attempt may take (5)"),
        ("--read-timeout-s", real, "live: a stream silent this long is lost (2)"),
        ("--max-part-mb", real, "live: the largest MJPEG frame accepted, MiB (8)"),
        ("--max-gap-s", real, "--realtime: longest wait for a file's next frame (10)"),
        ("--track", "const", "track objects per camera and across the rig (objects.jsonl)"),
        ("--topics", str, "recorded drive (.mcap, .bag): image topics to read, comma-separated"),
        ("--mcap", Path, "also write the results as an MCAP file (Foxglove)"),
        ("--mcap-images", "const", "with --mcap: the camera images too"),
        ("--rerun", "store_true", "stream to a Rerun viewer (spawned; needs drivepercept[viz])"),
        ("--rerun-connect", str, "stream to a running Rerun viewer (its gRPC URL)"),
        ("--rerun-save", Path, "save the Rerun recording to this .rrd file"),
        ("--rerun-serve", "store_true", "serve Rerun's web viewer on http://127.0.0.1:9090"),
    )
    p.add_argument("--no-report", dest="report", action="store_const", const="", help="no report")


def build_parser() -> Parser:
    parser = Parser(
        prog="drivepercept",
        description="Real-time multi-camera object detection with honest latency reports.",
    )
    parser.add_argument("--version", action="version", version=f"drivepercept {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help_text,
            description=help_text,
            epilog="examples:" + EXAMPLES[name],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    sim = command("simulate", "render a synthetic multi-camera drive with exact ground truth")
    sim.add_argument("--out", required=True, type=Path, help="output folder (created)")
    sim.add_argument("--cameras", type=int, default=6, help="1-12 (6: nuScenes layout)")
    sim.add_argument("--seconds", type=real, help="clip length (default 8; crossing: 30)")
    sim.add_argument("--fps", type=real, default=15.0, help="frames per second (default 15)")
    sim.add_argument("--size", default="640x360", help="WIDTHxHEIGHT, even (default 640x360)")
    sim.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    sim.add_argument("--no-noise", action="store_true", help="no sensor noise and blur")
    sim.add_argument("--format", choices=("mp4", "mcap"), default="mp4", help="(default mp4)")
    sim.add_argument("--preset", choices=("default", "crossing"), default="default", help="world")

    rep = command("replay", "run detection over a recorded multi-camera drive")
    _model_args(rep)
    _run_args(rep)
    rep.add_argument("--realtime", action="store_true", help="pace files as live cameras")

    fle = command("fleet", "replay many drives on Ray workers (local or a cluster), one report")
    _model_args(fle, "DRIVE")
    _flags(
        fle,
        ("--address", str, "auto or ray://HOST:PORT: join a cluster (default: start one here)"),
        ("--workers", int, "at most this many workers (default: as resources allow)"),
        ("--cpus-per-worker", real, "CPUs each worker asks for (default 1)"),
        ("--gpus-per-worker", real, "GPUs each worker asks for (default 1 if GPUs, else 0)"),
        ("--max-retries", int, "retries of a drive whose worker died (default 2)"),
        ("--resume", "store_true", "skip drives already complete with the same options"),
        ("--budget-ms", real, "latency budget of the reports' deadline misses (default 100)"),
        ("--report", str, "each drive's report files: html,json,csv,trace (default all)"),
        ("--save-video", "const", "also write annotated videos, one per camera"),
    )
    fle.add_argument("--out", required=True, type=Path, help="fleet folder: <drive>/, _fleet/")

    liv = command("live", "run detection on live cameras and streams (device, /dev/video, URL)")
    _model_args(liv)
    _run_args(liv)
    liv.add_argument("--camera", action="append", default=[], metavar="NAME=SOURCE")

    ev = command("eval", "COCO mAP and recall of a model on labelled data (clip, MOT, COCO)")
    _model_args(ev)
    _flags(
        ev,
        ("--ground-truth", Path, "an image-folder SOURCE's COCO json, or other labels"),
        ("--out", Path, "folder for run folders (default runs/)"),
        ("--name", str, "run folder name (default eval-<date>-<time>)"),
        ("--track", "const", "track, and score HOTA, MOTA, IDF1, same-id share, ego error"),
        ("--streaming", "store_true", "replay in real time: streaming AP beside offline AP"),
        ("--forecast", "store_true", "streaming, boxes forecast to capture time (tracks)"),
        ("--budget-ms", real, "streaming: the p99 latency budget the scheduler holds"),
    )
    ev.add_argument("--min-visibility", type=real, default=0.3, help="(default 0.3)")
    ev.add_argument("--min-height-px", type=real, default=12.0, help="(default 12)")

    ben = command("bench", "model ceiling, pipeline, naive loop, live cameras, capacity, sweep")
    _model_args(ben)
    which = ben.add_mutually_exclusive_group()
    which.add_argument("--mode", default="default", choices=BENCH_MODES, help="(default: three)")
    which.add_argument(
        "--sweep", dest="mode", action="store_const", const="sweep", help="= --mode sweep"
    )
    ben.add_argument("--frames", type=int, default=30, help="frames per camera (default 30)")
    ben.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    _flags(
        ben,
        ("--fps", real, "live, capacity, sweep: each camera's frame rate (rig's; 30; 15)"),
        ("--duration", real, "live: seconds measured (15); capacity: per step (10); sweep (5)"),
        ("--budget-ms", real, "capacity: the p99 budget (100); given, live runs hold it"),
        ("--no-schedule", "store_true", "a given budget is not held: every frame to the model"),
        ("--size", str, "capacity, sweep: cameras' WIDTHxHEIGHT (default 640x360)"),
        ("--json", Path, "also write the figures and the machine to this file"),
        ("--precisions", str, "sweep: e.g. fp32,bf16 (default: CPU fp32,bf16; CUDA +fp16)"),
        ("--timeouts-ms", str, "sweep: batch timeouts (default 5,20,50)"),
        ("--sweep-cameras", str, "sweep: camera counts (default 1,2,4)"),
        ("--plot", Path, "sweep: the PNG plot's path (default: --json's, .png)"),
    )

    srv = command("serve-cameras", "serve videos as live MJPEG cameras on 127.0.0.1 (tests)")
    srv.add_argument("sources", nargs="+", metavar="SOURCE", help="rig.toml, videos, folders")
    srv.add_argument("--port", type=int, default=8554, help="TCP port (default 8554; 0 = any)")
    srv.add_argument("--fps", type=real, help="frames per second (default: each file's own)")

    rpt = command("report", "latency report of a run folder (HTML, JSON, CSV, trace)")
    rpt.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a run folder (runs/<name>)")
    rpt.add_argument("--format", dest="report", default="html,json,csv,trace", help="(all)")
    rpt.add_argument("--budget-ms", type=real, default=100.0, help="deadline (default 100)")
    rpt.add_argument("--compare", type=Path, metavar="RUN_B", help="compare with RUN_B (B / A)")

    exp = command("export", "write a model as ONNX, with its sidecar TOML beside it")
    exp.add_argument("--model", required=True, help="drivepercept-tiny or yolox-nano ... yolox-x")
    exp.add_argument("--weights", default="DEFAULT", help="DEFAULT, none or a weights file")
    exp.add_argument("--format", default="onnx", choices=("onnx",), help="(default onnx)")
    exp.add_argument("--input", help="WxH (YOLOX: multiples of 32; default: the model's)")
    exp.add_argument("--batch", default="1", help="a batch size or dynamic (default 1)")
    exp.add_argument("--out", required=True, type=Path, help="the .onnx file")

    qua = command("quantize", "a static INT8 copy of an ONNX model, calibrated on real frames")
    qua.add_argument("model", type=Path, metavar="MODEL.onnx", help="a float32 ONNX detector")
    qua.add_argument("--calibrate", nargs="+", required=True, metavar="SOURCE", help="rigs, videos")
    qua.add_argument("--frames", type=int, default=96, help="calibration frames (default 96)")
    qua.add_argument("--input", help="WxH, for a model whose input size is dynamic")
    qua.add_argument("--out", type=Path, help="the INT8 .onnx file (default <stem>_int8.onnx)")
    qua.add_argument("--format", dest="quant_format", default="qdq", choices=tuple(QUANT_FORMATS))
    qua.add_argument("--per-tensor", action="store_true", help="one weight scale per tensor")
    return parser

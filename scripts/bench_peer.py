"""Peer benchmark: the same network, streams and machine through Ultralytics' multi-stream
predict and through drivepercept, in one run, interleaved.

The peer is what users pick instead of us: `YOLO(...).predict(source="x.streams",
stream=True)`, Ultralytics' documented multi-stream API. Ultralytics is AGPL and is never a
dependency of drivepercept; it lives in its own virtual environment outside the repository,
which reuses the system torch, OpenCV and numpy and drivepercept's dependencies:

    python3 -m venv --system-site-packages /work/peer-venv
    /work/peer-venv/bin/pip install ultralytics
    PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_peer.py --rounds 2 --duration 20

`YOLO_OFFLINE=1` is set before Ultralytics is imported: nothing is downloaded at run time.

The network is YOLOv8n built from Ultralytics' own config (`YOLO("yolov8n.yaml")`: random
weights, nothing downloaded), at a square input of --imgsz. Freshly built, its output does not
depend on the input (see `settle_norms`), so its batch norms first take their statistics from
a few frames of the clips, then are fused. drivepercept runs that module object, wrapped as
a `Detector`; Ultralytics deep-copies whatever model it is given in every predictor set-up,
so it runs its own copies of the same weights (made from one copy taken before any round).
The `Detector`'s `InputSpec` is Ultralytics' letterbox for these streams (the clips differ
in size, so Ultralytics pads every frame to the full square: bilinear resize, centred, pad
114, RGB, pixels / 255); its forward hands the head's decoded boxes and best-class scores to
drivepercept's own batched post-processing. Both sides keep boxes scoring at least --conf,
best class per box, class-aware NMS at --iou, at most --max-det per frame. The class biases
are shifted once, before anything runs, to put about --candidates anchors per frame above
--conf (Ultralytics initialises them so low that nothing would pass): both sides then filter
and suppress a realistic number of boxes. Replay checks that both find the same number of
boxes in every frame.

Threads: both tools run the network on the same intra-op threads, --threads (default: the
machine's cores). Ultralytics sets torch's threads to cpu_count - 1 when it sets up a
predictor on a CPU (and `cv2.setNumThreads(0)` when it is imported); the matched rounds put
--threads back in its `on_predict_start` callback. drivepercept gets them as the run's
`torch_threads` setting (its CPU lanes split them; an ONNX model's session gets them too),
with OpenCV's default threads and its own channels_last layout. --peer-default-threads adds a
round of the peer at its own default (torch: cpu_count - 1, one thread on a 2-core machine;
ONNX Runtime: its default, one per physical core) after each matched pair: a second line,
labelled "peer's own default threads (not like for like)". Every line says how many
threads each side used.

Runtimes (--runtime torch, onnxruntime or both, the default): on torch, each tool runs the
network object as above. On onnxruntime, the same settled and calibrated network is exported
once (`_bench_peer/exported.py`: opset 17, dynamic batch, height and width, with the
metadata Ultralytics' own exporter writes, and drivepercept's sidecar with the torch
`Detector`'s letterbox); the peer runs it through its documented path,
`YOLO("yolov8n.onnx", task="detect").predict(...)`, with its ORT session given --threads
intra-op threads (AutoBackend has no setting for them: its backend is handed session
options for the matched rounds), and drivepercept runs `--model yolov8n.onnx` (runtime
onnxruntime, every class) on `torch_threads` = --threads. Replay checks boxes per frame
against the peer's on the same runtime.

Modes, each run as peer, ours[, peer-own] per runtime (every other round in the reverse order:
a run's place in its round biases it), round after round, for --rounds rounds:

* replay: every frame of --streams file streams (the clips in --videos, cycled), each cut to
  --replay-frames (default: the shortest clip). Peer: a `.streams` file of the paths with
  `stream_buffer=True` (its reader threads then queue every frame; with the default False a
  reader keeps only its newest frame and a video file is read as fast as it decodes, so most
  frames are skipped), stopped after that many batches. Ours: `Mode.REPLAY` with
  `max_frames`.
* live: --streams cameras served by drivepercept's `CameraServer` (MJPEG over HTTP on
  127.0.0.1, looped) at --fps, read for --duration seconds by each tool in turn. Peer: a
  `.streams` file of the URLs, Ultralytics' defaults (newest frame per stream). Ours:
  `Mode.LIVE` with its defaults.

What is measured, the same way on both sides:

* fps: frames whose results came out after the first batch's, divided by the time from the
  first batch's results to the last results (start-up, warm-up and the first batch excluded).
* latency (live): from the frame's arrival at the client to its results. Ours: frames.csv's
  end_to_end_ms (capture_ns: when the JPEG's last byte was read, before decoding ->
  emitted_ns, results handed to the outputs). Peer: the moment OpenCV's `grab()` returned the
  frame in Ultralytics' reader thread (OpenCV reads and decodes in that call) -> the moment
  the predict generator yields its `Results`. The stamp comes from a wrapper around
  `cv2.VideoCapture` given to Ultralytics' loader module only, matched to the `Results` by
  the frame array it returned; the peer's figure therefore leaves out its JPEG decode
  (printed as "peer JPEG decode", measured on the served frames), a bias in its favour.
  First-batch frames are excluded.
* steal % (every round): the share of the host's CPU time its hypervisor gave to other
  tenants during the round (/proc/stat). On a shared cloud host it swings from 0 to 50 %,
  and it does not cost both tools the same: torch's OpenMP threads wait for each other at
  the end of every operation, so a stolen core stalls the peer's whole batch, while
  drivepercept's CPU lanes each run on one thread of their own.
* delivered (live): frames the server wrote to the tool's connections during its round
  (`CameraServer.frames_sent`), so the share each tool processed is comparable.

Exit status: 0 done, 1 a run failed, 2 ultralytics or the clips are missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _bench_peer.network import _Ultralytics
from _bench_peer.options import parse_args
from _bench_peer.process import Globals
from _bench_peer.rounds import bench
from _bench_peer.stats import RoundResult, table

from drivepercept.finite import finite

MISSING_PEER = (
    "bench_peer: ultralytics is not importable with {python}; run this script with the peer "
    "venv: python3 -m venv --system-site-packages /work/peer-venv && "
    "/work/peer-venv/bin/pip install ultralytics, then "
    "PYTHONPATH=. /work/peer-venv/bin/python scripts/bench_peer.py"
)


def main(argv: Sequence[str] | None = None) -> int:
    settings = parse_args(argv)
    if importlib.util.find_spec("ultralytics") is None:
        print(MISSING_PEER.format(python=sys.executable), file=sys.stderr)
        return 2
    if not settings.videos.is_dir():
        print(f"bench_peer: expected a folder of clips, got {settings.videos}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("drivepercept").setLevel(logging.WARNING)
    import cv2
    import torch

    from drivepercept.errors import DrivePerceptError

    # torch and OpenCV as drivepercept finds them, before Ultralytics changes them (its
    # import sets OpenCV to 0 threads and OMP_NUM_THREADS=1; its CPU set-up, torch's threads)
    globals_ = Globals(
        torch_threads=torch.get_num_threads(),
        cv2_threads=cv2.getNumThreads(),
        threads=settings.threads,
    )
    os.environ.setdefault("YOLO_OFFLINE", "1")  # no update checks or events, no network
    peer = _Ultralytics()
    with contextlib.ExitStack() as stack:
        if settings.out is not None:
            settings.out.mkdir(parents=True, exist_ok=True)
            work = settings.out
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-peer-")))
        try:
            record = bench(settings, peer, globals_, work)
        except (DrivePerceptError, FileNotFoundError, ValueError) as exc:
            print(f"bench_peer: error: {exc}", file=sys.stderr)
            return 1
    rounds = [RoundResult(**r) for r in record["rounds"]]
    v = record["versions"]
    print(
        f"ultralytics {v['ultralytics']}, torch {v['torch']}, onnxruntime {v['onnxruntime']}; "
        f"{len(record['streams'])} streams; replay {record['replay_frames_per_stream']} frames "
        f"a stream; peer JPEG decode (not in its latency) {record['peer_jpeg_decode_ms']:.1f} ms"
    )
    print(
        f"both tools on {settings.threads} threads ({os.cpu_count()} cores) unless the line "
        "says the peer's own default threads; threads 'ort': ONNX Runtime's default"
    )
    for line in table(rounds, record["summary"]):
        print(line)
    if settings.json_path is not None:
        text = json.dumps(finite(record), indent=2, allow_nan=False)
        settings.json_path.write_text(text + "\n", encoding="utf-8")
        print(f"written {settings.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# Every GPU check in one run, in at most 8 minutes: each step runs under `timeout -k`, and
# the limits, kill grace included, add up to 480 s (a test checks the sum).
#
#   1. environment: nvidia-smi, torch/CUDA/OpenCV versions
#   2. the tests marked `cuda` (pinned ring, slot reuse, copy/compute overlap, batches in
#      flight, fp16/bf16 geometry, real NVML)
#   3. `drivepercept bench` (model-only vs pipeline vs naive) for ssdlite in fp32 and fp16,
#      for drivepercept-tiny in bf16 and for yolox-nano in fp16 (random weights: no network
#      there; a score threshold of 0.99 keeps its untrained scores from flooding NMS), and
#      drivepercept-tiny in bf16 again with --compile --cuda-graphs (compiled and captured
#      in the warm-ups, which no figure counts; one round of FRAMES: compiling takes time)
#   4. replays of the sample rig in fp32 and fp16 with their latency reports (warm-up,
#      batches in flight) and the fp32/fp16 comparison
#   5. NVML figures present in the fp32 run's summary.json
#   6. 15 s of live detection on 6 served cameras (fp16)
#   7. the load sampler's cost (replay with the sampler on vs off)
#
# Usage:
#   bash scripts/gpu_check.sh            # on a machine with a CUDA GPU
#   bash scripts/gpu_check.sh --dry-run  # every step on the CPU with tiny sizes: the default
#                                        # test suite runs this, so the script itself is tested
#
# No pip, no network: the project runs from this checkout through PYTHONPATH. The lent GPU
# machine (the device tool) has torch, torchvision, opencv-python-headless, numpy,
# nvidia-ml-py, psutil, matplotlib, prometheus-client, pytest and pytest-timeout. Anything
# else comes as wheels in the folder `.whl/` at the repository root, unpacked here with
# `python3 -m zipfile -e` into a temporary folder put on PYTHONPATH (pure-Python wheels
# only). `.whl/` is ignored by git, so a device run must carry it. Fill it once, here:
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       -d .whl tomli-w pytest-timeout
#
# and run it on the device tool with carry [".whl"] and the command
# `bash scripts/gpu_check.sh`. Nothing needs them to start: tomli-w only writes rig files
# (simulate), and without pytest-timeout the tests run without their time limits.
#
# Results go to $OUT (default ./gpu_check_out), three files, as the device tool brings back
# at most 8: gpu_check.log (every step's output), summary.txt (the key figures) and
# results.tgz (each run's summary.json, run.json and report.html, the comparison, the bench
# tables). Exit status: non-zero if any step failed or ran out of time.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
case "${1:-}" in
    "") ;;
    --dry-run) DRY_RUN=1 ;;
    *) echo "usage: gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac

OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
LOG="$OUT/gpu_check.log"
: >"$LOG"
export PYTHONUNBUFFERED=1

SITE="$WORK/site"
mkdir -p "$SITE"
for wheel in .whl/*.whl; do
    [ -e "$wheel" ] || continue
    python3 -m zipfile -e "$wheel" "$SITE" || { echo "gpu_check: cannot unpack $wheel" >&2; exit 1; }
done
export PYTHONPATH="$PWD:$SITE${PYTHONPATH:+:$PYTHONPATH}"

if [ "$DRY_RUN" -eq 1 ]; then
    DEVICE=cpu FRAMES=3 ROUNDS=1 MAX_FRAMES=6 LIVE_S=3 SAMPLER_FRAMES=6
    # no CUDA graphs on a CPU, and inductor takes minutes there: the flags' parsing only
    SPEED_FLAGS="--no-compile --no-cuda-graphs"
else
    DEVICE=cuda FRAMES=60 ROUNDS=2 MAX_FRAMES=0 LIVE_S=15 SAMPLER_FRAMES=60
    SPEED_FLAGS="--compile --cuda-graphs"
fi
KILL_AFTER=5
status=0
RUNS="$WORK/runs"
mkdir -p "$RUNS" "$WORK/results"

# step NAME LIMIT_S COMMAND...: run one step under its limit, its output into the log
step() {
    local name="$1" limit="$2"
    shift 2
    echo "== $name (limit ${limit} s)" | tee -a "$LOG"
    local started=$SECONDS
    # a new bash runs the step's function; timeout signals its whole process group, so a
    # replay that drains on SIGTERM is still killed KILL_AFTER seconds later
    timeout -k "$KILL_AFTER" "$limit" bash -c '"$@"' step "$@" 2>&1 | tee -a "$LOG"
    local rc="${PIPESTATUS[0]}"
    echo "== $name: exit $rc after $((SECONDS - started)) s" | tee -a "$LOG"
    if [ "$rc" -ne 0 ]; then
        status=1
    fi
    return "$rc"
}

drivepercept() { python3 -m drivepercept "$@"; }

environment() {
    if [ "$DRY_RUN" -eq 0 ]; then
        nvidia-smi || return 1
    fi
    python3 - "$DEVICE" <<'PY'
import sys

import cv2
import torch
import torchvision

print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("torchvision", torchvision.__version__, "opencv", cv2.__version__)
if sys.argv[1] == "cuda":
    if not torch.cuda.is_available():
        sys.exit("gpu_check: CUDA is not available")
    print("gpu", torch.cuda.get_device_name(0))
PY
}

cuda_tests() {
    local args=(-m cuda -q -p no:cacheprovider -rs tests)
    python3 -m pytest "${args[@]}" >"$WORK/pytest.txt" 2>&1
    local rc=$?
    cat "$WORK/pytest.txt"
    [ "$rc" -eq 0 ] || return "$rc"
    if [ "$DRY_RUN" -eq 1 ]; then
        grep -q " skipped" "$WORK/pytest.txt"  # collected and skipped without a GPU
    else
        ! grep -q " skipped" "$WORK/pytest.txt" && grep -q " passed" "$WORK/pytest.txt"
    fi
}

bench() {
    local model="$1" precision="$2"
    drivepercept bench sample_videos/rig.toml --model "$model" --weights "$3" "${@:4}" \
        --device "$DEVICE" --precision "$precision" --frames "$FRAMES" --rounds "$ROUNDS" \
        | tee "$WORK/results/bench-$model-$precision.txt"
}

bench_speed() {
    # shellcheck disable=SC2086  # two flags, split on purpose
    drivepercept bench sample_videos/rig.toml --model drivepercept-tiny --weights DEFAULT \
        --device "$DEVICE" --precision bf16 --frames "$FRAMES" --rounds 1 $SPEED_FLAGS \
        | tee "$WORK/results/bench-drivepercept-tiny-bf16-compile-graphs.txt"
}

replay() {
    local precision="$1"
    drivepercept replay sample_videos/rig.toml --device "$DEVICE" --precision "$precision" \
        --max-frames "$MAX_FRAMES" --out "$RUNS" --name "replay-$precision" --no-progress
}

nvml_figures() {
    python3 - "$RUNS/replay-fp32/summary.json" "$DRY_RUN" <<'PY'
import json
import sys

summary = json.load(open(sys.argv[1]))
load = summary["load"]
print(json.dumps(load, indent=1))
if load["process_cpu_pct"]["max"] is None:
    sys.exit("gpu_check: no CPU load figures")
if sys.argv[2] == "0":
    gpus = load["gpus"]
    if load["gpu_unavailable"] or not gpus or gpus[0]["util_pct"]["max"] is None:
        sys.exit(f"gpu_check: no NVML figures: {load['gpu_unavailable']}")
PY
}

live() {
    local port
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    # python itself in the background (not a shell function, whose $! would be a subshell
    # and leave the server running when killed)
    python3 -m drivepercept serve-cameras sample_videos/rig.toml --port "$port" \
        >"$WORK/serve.txt" 2>&1 &
    local server=$!
    # shellcheck disable=SC2064
    trap "kill $server 2>/dev/null" EXIT
    local cams=() cam
    for cam in front front_left front_right back back_left back_right; do
        cams+=("--camera=$cam=http://127.0.0.1:$port/$cam.mjpg")
    done
    python3 - "$port" <<'PY' || return 1
import socket
import sys
import time

deadline = time.monotonic() + 20
while True:  # the server is up once it accepts a connection
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("gpu_check: the camera server did not come up in 20 s")
        time.sleep(0.2)
PY
    # the served cameras show the synthetic world: its model (a URL has no rig to name it)
    drivepercept live "${cams[@]}" --model drivepercept-tiny --device "$DEVICE" \
        --precision "$LIVE_PRECISION" --duration "$LIVE_S" --out "$RUNS" --name live --no-progress
}

sampler_cost() {
    python3 scripts/bench_sampler.py --device "$DEVICE" --rounds "$ROUNDS" \
        --max-frames "$SAMPLER_FRAMES"
}

if [ "$DRY_RUN" -eq 1 ]; then
    HALF=bf16 LIVE_PRECISION=fp32  # CPU autocast: bf16 only
else
    HALF=fp16 LIVE_PRECISION=fp16
fi
export DRY_RUN DEVICE FRAMES ROUNDS MAX_FRAMES LIVE_S SAMPLER_FRAMES LIVE_PRECISION WORK RUNS
export SPEED_FLAGS
export -f drivepercept environment cuda_tests bench bench_speed replay nvml_figures live
export -f sampler_cost

step environment 30 environment
step "cuda tests" 100 cuda_tests
step "bench ssdlite fp32" 25 bench ssdlite320_mobilenet_v3_large fp32 none
step "bench ssdlite $HALF" 25 bench ssdlite320_mobilenet_v3_large "$HALF" none
step "bench drivepercept-tiny bf16" 25 bench drivepercept-tiny bf16 DEFAULT
step "bench drivepercept-tiny bf16 $SPEED_FLAGS" 45 bench_speed
step "bench yolox-nano $HALF" 25 bench yolox-nano "$HALF" none --score-threshold 0.99
step "replay fp32" 30 replay fp32
step "replay $HALF" 30 replay "$HALF"
step "compare fp32 vs $HALF" 10 drivepercept report "$RUNS/replay-fp32" \
    --compare "$RUNS/replay-$HALF"
step "NVML figures" 5 nvml_figures
step "live" 35 live
step "sampler cost" 30 sampler_cost

# the key figures of every run, for the note
python3 - "$RUNS" >"$OUT/summary.txt" 2>&1 <<'PY'
import json
import sys
from pathlib import Path

for run in sorted(Path(sys.argv[1]).iterdir()):
    try:
        summary = json.loads((run / "summary.json").read_text())
        record = json.loads((run / "run.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"{run.name}: no summary ({exc})")
        continue
    e2e = summary["end_to_end_ms"]
    print(
        f"{run.name}: {summary['frames']} frames, {summary['throughput_fps']} frames/s, "
        f"p50 {e2e['p50_ms']} ms, p99 {e2e['p99_ms']} ms, status {record.get('status')}"
    )
    engine = record.get("summary", {})
    print(f"  warm-up {engine.get('warmup')}, in flight at most {engine.get('in_flight_high_water')}")
    for gpu in summary["load"]["gpus"]:
        print(
            f"  {gpu['name']}: util {gpu['util_pct']}, memory {gpu['mem_used_mb']} MB, "
            f"power {gpu['power_w']} W, {gpu['temperature_c']} C, SM {gpu['sm_clock_mhz']} MHz"
        )
    if summary["load"]["gpu_unavailable"]:
        print(f"  no GPU figures: {summary['load']['gpu_unavailable']}")
PY
cat "$OUT/summary.txt" | tee -a "$LOG"
for table in "$WORK"/results/bench-*.txt; do
    [ -e "$table" ] || continue
    { echo "$(basename "$table" .txt):"; cat "$table"; } >>"$OUT/summary.txt"
done

for run in "$RUNS"/*/; do
    name="$(basename "$run")"
    mkdir -p "$WORK/results/$name"
    cp "$run"/summary.json "$run"/run.json "$run"/report.html "$run"/compare-*.html \
        "$WORK/results/$name/" 2>/dev/null
done
tar -czf "$OUT/results.tgz" -C "$WORK" results
echo "gpu_check: $([ "$status" -eq 0 ] && echo passed || echo FAILED); results in $OUT" | tee -a "$LOG"
exit "$status"

#!/usr/bin/env bash
# Every GPU check in one run (well under 8 minutes on one GPU): the tests marked `cuda`
# (pinned staging ring, slot reuse under load, copy/compute overlap, fp16/bf16, real NVML),
# `drivepercept bench` on the GPU for two models and three precisions, two replays (fp32 and
# fp16) with their latency reports and NVML load samples plus their comparison, a 20 s live
# run of 6 served cameras, and the load sampler's cost (on vs off). Results go to $OUT (default ./gpu_check_out). Exit status:
# non-zero if any check failed.
#
# On a machine with a package registry it installs the project with pip. On one without
# (the lent GPU machine), put the pure-Python wheels it lacks into .whl/ first, e.g.
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl tomli-w pytest-timeout
# and they are installed from there instead (torch, torchvision, OpenCV and pytest are
# expected to be present).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu_check_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/drivepercept-site .whl/*.whl || exit 1
    export PYTHONPATH="$PWD:/tmp/drivepercept-site${PYTHONPATH:+:$PYTHONPATH}"
else
    python3 -m pip install -q -e '.[dev]' || exit 1
fi

status=0
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || { echo "gpu_check: nvidia-smi failed" >&2; status=1; }
python3 - >"$OUT/env.txt" 2>&1 <<'PY'
import torch, torchvision, cv2
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("torchvision", torchvision.__version__, "opencv", cv2.__version__)
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0))
PY
cat "$OUT/env.txt"

timeout 240 python3 -m pytest -m cuda -q -p no:cacheprovider -rs tests 2>&1 | tee "$OUT/pytest-cuda.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
grep -q " passed" "$OUT/pytest-cuda.txt" || { echo "gpu_check: no cuda test ran" >&2; status=1; }

for model in ssdlite320_mobilenet_v3_large fasterrcnn_mobilenet_v3_large_320_fpn; do
    for precision in fp32 fp16 bf16; do
        echo "== bench $model $precision" | tee -a "$OUT/bench.txt"
        timeout 60 python3 -m drivepercept bench sample_videos/rig.toml --model "$model" \
            --weights none --device cuda --precision "$precision" --frames 60 2>&1 \
            | tee -a "$OUT/bench.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    done
done
# replays with the latency report; NVML must have sampled the GPU
for precision in fp32 fp16; do
    echo "== replay + report drivepercept-tiny $precision" | tee -a "$OUT/replay.txt"
    timeout 120 python3 -m drivepercept replay sample_videos/rig.toml --device cuda \
        --precision "$precision" --out "$OUT/runs" --name "gpu-$precision" --no-progress 2>&1 \
        | tee -a "$OUT/replay.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
    rm -f "$OUT/runs/gpu-$precision/detections.jsonl"  # large; not needed back
done
timeout 60 python3 -m drivepercept report "$OUT/runs/gpu-fp32" --compare "$OUT/runs/gpu-fp16" \
    2>&1 | tee "$OUT/compare.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
python3 - "$OUT/runs/gpu-fp32/summary.json" <<'PY' 2>&1 | tee "$OUT/nvml.txt" || status=1
import json, sys
load = json.load(open(sys.argv[1]))["load"]
print(json.dumps(load, indent=1))
if load["gpu_unavailable"] or not load["gpus"] or load["gpus"][0]["util_pct"]["max"] is None:
    sys.exit(f"gpu_check: no NVML figures: {load['gpu_unavailable']}")
PY

echo "== live: 6 served cameras at 15 fps for 20 s, drivepercept-tiny fp16" | tee "$OUT/live.txt"
python3 -m drivepercept serve-cameras sample_videos/rig.toml --port 8554 >"$OUT/serve.txt" 2>&1 &
serve_pid=$!
sleep 3
cams=()
for cam in front front_left front_right back back_left back_right; do
    cams+=("--camera=$cam=http://127.0.0.1:8554/$cam.mjpg")
done
timeout 90 python3 -m drivepercept live "${cams[@]}" --device cuda --precision fp16 \
    --duration 20 --out "$OUT/runs" --name live-fp16 --no-progress 2>&1 | tee -a "$OUT/live.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
kill "$serve_pid" 2>/dev/null
rm -f "$OUT/runs/live-fp16/detections.jsonl"

echo "== load sampler cost on the GPU" | tee "$OUT/sampler.txt"
timeout 150 python3 scripts/bench_sampler.py --device cuda --rounds 3 2>&1 | tee -a "$OUT/sampler.txt"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
exit "$status"

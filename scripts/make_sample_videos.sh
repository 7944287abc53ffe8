#!/usr/bin/env bash
# Re-render the committed sample rig (sample_videos/). Same seed, same ground truth.
set -euo pipefail
cd "$(dirname "$0")/.."
drivepercept simulate --out sample_videos --cameras 6 --seconds 8 --fps 15 --size 640x360 --seed 42

"""The pieces of scripts/bench_peer.py (its docstring says what the benchmark does and how
to run it), one job a module:

* `options`: the command line -> `Settings`.
* `stats`: the pure figures (throughput, percentiles, best / median, ratios) and the report.
* `streams`: the clips as streams, Ultralytics' `.streams` file, the JPEG decode time.
* `network`: YOLOv8n from Ultralytics' config, settled and calibrated, as a `Detector`.
* `exported`: that network exported once to ONNX, for both tools' ONNX Runtime paths.
* `process`: the process-wide settings (torch and OpenCV threads) each tool gets.
* `stamps`: when each frame reached Ultralytics' reader threads.
* `rounds`: one round of each tool, and every round, interleaved.

The folder is named after its script with a leading underscore so that it clashes with no
installed package; `python3 scripts/bench_peer.py` finds it (the scripts folder is first on
sys.path).
"""

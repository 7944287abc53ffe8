"""What each subcommand does: merge the config file and the flags, call a job, print."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drivepercept import bench as benches
from drivepercept import report as reports
from drivepercept import run as jobs
from drivepercept.errors import ConfigError, redact

if TYPE_CHECKING:  # the jobs load torch and OpenCV: imported when a command runs them
    from drivepercept.run import RunResult
    from drivepercept.run.console import Progress

log = logging.getLogger("drivepercept")
# the exit codes (README): bad input 2 is also argparse's; see main() and cmd_run
EXIT_OK, EXIT_INTERNAL, EXIT_INPUT, EXIT_PARTIAL = 0, 1, 2, 3
EXIT_NO_FRAMES, EXIT_INTERRUPTED = 4, 130
RECONNECT = {
    "initial_s": "reconnect_initial_s",
    "max_s": "reconnect_max_s",
    "max_attempts": "reconnect_attempts",
    "open_timeout_s": "open_timeout_s",
    "read_timeout_s": "read_timeout_s",
    "max_part_mb": "max_part_mb",
}


def merged_settings(args: argparse.Namespace) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Sources and settings: the --config file's keys first (a `[replay]` table or the top
    level), the flags on top. The one place config file and flags meet.

    Raises:
        ConfigError: unknown keys in the file, or no source at all.
    """
    settings: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        settings.update(jobs.read_settings_file(args.config))
    for key in (*jobs.PIPELINE_KEYS, *jobs.RUN_KEYS, "report"):
        value = getattr(args, key, None)
        if value is not None:
            settings[key] = value
    for key, value in jobs.environment_settings(os.environ).items():  # nothing below reads it
        settings.setdefault(key, value)
    sources = [*settings.pop("sources", []), *(getattr(args, "sources", None) or [])]
    sources += getattr(args, "camera", None) or []
    if getattr(args, "rig", None):
        sources.insert(0, args.rig)
    if not sources:
        raise ConfigError("give at least one SOURCE (rig.toml, video file, folder or camera)")
    return tuple(str(s) for s in sources), settings


def run_options(args: argparse.Namespace, mode: jobs.Mode) -> jobs.RunOptions:
    sources, settings = merged_settings(args)
    formats = settings.get("report", reports.ALL_FORMATS)
    flag = vars(args).get
    reconnect: dict[str, Any] = {k: flag(a) for k, a in RECONNECT.items() if flag(a) is not None}
    return jobs.RunOptions(
        sources=sources,
        mode=mode,
        **jobs.ModelOptions.from_settings(settings).run_fields(),
        settings={k: v for k, v in settings.items() if k in jobs.PIPELINE_KEYS},
        out_root=Path(settings.get("out", "runs")),
        name=settings.get("name"),
        save_video=bool(settings.get("save_video")),
        mosaic=bool(settings.get("mosaic")),
        report_formats=reports.parse_formats(formats) if formats else (),
        budget_ms=settings.get("budget_ms"),
        max_gap_s=float(settings.get("max_gap_s", jobs.DEFAULT_MAX_GAP_S)),
        duration_s=flag("duration"),
        reconnect=jobs.ReconnectPolicy(**reconnect),
        metrics_port=flag("metrics_port"),
        metrics_linger_s=flag("metrics_linger_s") or 0.0,
        show=can_show(bool(flag("show"))),
        topics=jobs.topics_setting(settings.get("topics")),
        mcap=settings.get("mcap"),
        mcap_images=bool(settings.get("mcap_images")),
        track=bool(settings.get("track")),
        schedule=not flag("no_schedule"),
        priorities=jobs.priorities_setting(settings.get("priority")),
        rerun=jobs.rerun_target(
            flag("rerun"), flag("rerun_connect"), flag("rerun_save"), flag("rerun_serve")
        ),
    )


def can_show(wanted: bool) -> bool:
    """--show only where there is a display: OpenCV's Qt GUI aborts the whole process when it
    finds none, so without one the run goes on without a window (and says so)."""
    if wanted and sys.platform.startswith("linux"):
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            log.warning("--show: no display (DISPLAY is not set); running without a window")
            return False
    return wanted


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _with_progress(args: argparse.Namespace, job: Callable[[Progress], Any]) -> Any:
    """Run a job with the progress display; SIGTERM stops it like Ctrl-C (drain, outputs)."""
    from drivepercept.run.console import Progress

    bar = Progress(enabled=not args.no_progress and sys.stderr.isatty(), log_status=args.verbose)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return job(bar)
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.finish()


def cmd_run(args: argparse.Namespace) -> int:
    """`replay` (files as fast as they decode, or paced with --realtime) and `live`: a run."""
    from drivepercept.run import run
    from drivepercept.run.console import report_lines, summary_table

    live = args.command == "live"
    mode = jobs.Mode.LIVE if live else jobs.Mode.REALTIME if args.realtime else jobs.Mode.REPLAY
    options = run_options(args, mode)
    result: RunResult = _with_progress(args, lambda bar: run(options, progress=bar))
    print(summary_table(result))
    print(f"run folder: {result.run_dir}")
    if result.report is not None:
        print("\n".join(report_lines(result.report)))
    why = result.failure()
    if result.stats.interrupted and not result.error:
        print("interrupted: outputs hold the frames processed so far", file=sys.stderr)
        return EXIT_INTERRUPTED
    if why:
        print(f"drivepercept {args.command}: error: {redact(why)}", file=sys.stderr)
        return EXIT_NO_FRAMES if result.error and not result.stats.frames else EXIT_PARTIAL
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    from drivepercept.run import EvalThresholds, evaluate_clip

    sources, settings = merged_settings(args)
    if len(sources) != 1:
        raise ConfigError("eval takes exactly one clip: a rig, a MOT sequence or a COCO json")
    th = EvalThresholds(min_visibility=args.min_visibility, min_height_px=args.min_height_px)
    result = _with_progress(
        args,
        lambda bar: evaluate_clip(
            sources[0],
            ground_truth=args.ground_truth,
            settings=settings,
            thresholds=th,
            progress=bar,
            track=bool(settings.get("track")),
            streaming=args.streaming,
            forecast=args.forecast,
        ),
    )
    if result is None:
        print("interrupted: no evaluation", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"{result.table()}\nrun folder: {result.run.run_dir}")
    return EXIT_OK


def cmd_bench(args: argparse.Namespace) -> int:
    if args.mode in ("capacity", "sweep") and not (args.sources or args.rig or args.config):
        args.sources = [benches.SIMULATED]  # capacity and the sweep render their own cameras
    request = benches.BenchRequest(
        args.mode,
        frames_per_camera=args.frames,
        rounds=args.rounds,
        fps=args.fps,
        duration_s=args.duration,
        size=args.size,
        precisions=args.precisions,
        timeouts_ms=args.timeouts_ms,
        sweep_cameras=args.sweep_cameras,
        plot=args.plot,
    )
    options = run_options(args, jobs.Mode.REPLAY)
    # capacity's steps and the sweep's cells show as they go (stderr: stdout gets the table)
    report = benches.run_bench(
        options,
        request,
        on_step=lambda s: print(f"step: {s.line()}", file=sys.stderr, flush=True),
    )
    print(report.table())
    if args.json is not None:
        benches.write_bench_json(args.json, request, report)
        print(f"figures: {args.json}")
    plot = request.plot_path(args.json)
    if plot is not None:
        benches.write_bench_plot(plot, report)
        print(f"plot: {plot}")
    return EXIT_OK


def cmd_simulate(args: argparse.Namespace) -> int:
    from drivepercept.sim.clip import log_progress, simulate_clip
    from drivepercept.sim.config import DEFAULT_SECONDS, SimulationConfig, parse_size

    width, height = parse_size(args.size)
    config = SimulationConfig(
        out_dir=args.out,
        cameras=args.cameras,
        seconds=DEFAULT_SECONDS[args.preset] if args.seconds is None else args.seconds,
        fps=args.fps,
        width=width,
        height=height,
        seed=args.seed,
        noise=not args.no_noise,
        format=args.format,
        preset=args.preset,
    )
    result = simulate_clip(config, progress=log_progress())  # logged with -v
    per_cam_fps = result.frames / result.elapsed_s if result.elapsed_s > 0 else 0.0
    what = f"{len(result.videos)} videos" if args.format == "mp4" else f"{args.cameras} cameras"
    print(
        f"wrote {what} x {result.frames} frames, {result.annotations} boxes, to "
        f"{result.out_dir} in {result.elapsed_s:.1f} s ({per_cam_fps:.1f} rig frames/s)"
    )
    if result.interrupted:
        print("interrupted: the files hold the frames rendered so far", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK


def cmd_serve(args: argparse.Namespace) -> int:
    from drivepercept.sim.serve import CameraServer, cameras_from_sources, serve_forever

    server = CameraServer(cameras_from_sources(args.sources), port=args.port, fps=args.fps)
    server.start()
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for cam in server.cameras:
        print(f"{cam.name}: {server.url(cam.name)} ({cam.fps:g} fps, {cam.path})", flush=True)
    try:
        serve_forever(server, stop=stop)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.close()
        signal.signal(signal.SIGTERM, previous)
    return EXIT_OK


def cmd_report(args: argparse.Namespace) -> int:
    from drivepercept.run.console import report_lines

    if args.compare is not None:
        comparison = reports.write_comparison(args.run_dir, args.compare, budget_ms=args.budget_ms)
        print(comparison.text)
        print(f"comparison: {comparison.html}")
        problems = comparison.problems
    else:
        written = reports.write_report(
            args.run_dir, formats=reports.parse_formats(args.report), budget_ms=args.budget_ms
        )
        print("\n".join(report_lines(written)))
        problems = written.problems
    if problems:
        more = f" (and {len(problems) - 1} more, listed in the report)" if len(problems) > 1 else ""
        print(
            f"drivepercept report: error: the report covers what is there, but {problems[0]}{more}",
            file=sys.stderr,
        )
        return EXIT_PARTIAL
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    env = jobs.environment_settings(os.environ)
    done = jobs.export_model(
        args.model, out=args.out, weights=args.weights, fmt=args.format,
        input_size=args.input, batch=args.batch,
        **{k: env[k] for k in ("weights_dir", "weights_mirror") if k in env},
    )  # fmt: skip
    print(f"wrote {done.onnx} ({done.layout}) and {done.sidecar}")
    return EXIT_OK


def cmd_quantize(args: argparse.Namespace) -> int:
    done = jobs.quantize_model(
        args.model,
        sources=args.calibrate,
        out=args.out,
        frames=args.frames,
        input_size=args.input,
        quant_format=args.quant_format,
        per_channel=not args.per_tensor,
    )
    print("\n".join(done.lines()))
    return EXIT_OK


def cmd_fleet(args: argparse.Namespace) -> int:
    from drivepercept.fleet import FleetOptions, run_fleet
    from drivepercept.fleet.console import FleetBar, fleet_table
    from drivepercept.fleet.options import shared_run

    drives, settings = merged_settings(args)
    template = run_options(args, jobs.Mode.REPLAY)
    fleet = {k: v for k in FLEET_FLAGS if (v := getattr(args, k)) is not None}
    options = FleetOptions(
        drives=drives, out=args.out, run=shared_run(template, model=settings.get("model")), **fleet
    )
    bar = FleetBar(enabled=not args.no_progress and sys.stderr.isatty())
    previous = signal.signal(signal.SIGTERM, _terminate)  # SIGTERM stops it like Ctrl-C
    try:
        result = run_fleet(options, on_progress=bar if bar.enabled else None)
    finally:
        signal.signal(signal.SIGTERM, previous)
        bar.finish()
    print(fleet_table(result))
    print(f"fleet report: {result.fleet_html}")
    if result.interrupted:
        print("interrupted: the report holds the drives that finished", file=sys.stderr)
        return EXIT_INTERRUPTED
    why = result.failure()
    if why:
        print(f"drivepercept fleet: error: {redact(why)}", file=sys.stderr)
        return EXIT_PARTIAL
    return EXIT_OK


FLEET_FLAGS = ("address", "workers", "cpus_per_worker", "gpus_per_worker", "max_retries", "resume")
HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "simulate": cmd_simulate,
    "replay": cmd_run,
    "live": cmd_run,
    "eval": cmd_eval,
    "bench": cmd_bench,
    "serve-cameras": cmd_serve,
    "report": cmd_report,
    "export": cmd_export,
    "quantize": cmd_quantize,
    "fleet": cmd_fleet,
}

"""`yoloedge bench reload`: the daemon's memory across reloads that add and remove cameras.

Runs the real daemon (a subprocess, a private mosquitto) with no camera, then `--cycles` times:
rewrites its config with `--cameras` synthetic cameras of `--size` and sends SIGHUP, waits until
every camera has delivered `--frames` frames, then rewrites it with none and sends SIGHUP again.
Prints the daemon's RSS, threads and open files at the start, with the cameras, and after each
removal. What is held after a removal should not grow with the cycles: a removed camera's frames
are freed when it stops, and the daemon hands the freed heap back to the system (see `heap`)
once their capture threads have ended, so each "removed" row is taken when the daemon's thread
count has stopped falling (unchanged for `STABLE_S`).
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time
from pathlib import Path

import yaml

from ..localbroker import free_port, mosquitto_or_say, start_broker
from .host import ProcSample, sample_process
from .pipeline import Daemon, bench_config

#: how long one reload, or the cameras' first frames, may take before the bench gives up
WAIT_S = 120.0
#: the removed cameras' threads are gone (and the main loop has had its ticks) when the daemon's
#: thread count has not changed for this long
STABLE_S = 2.0


def add_parser(bsub) -> None:
    p = bsub.add_parser("reload", help="the daemon's memory across reloads adding and removing cameras",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="ONNX model (e.g. the demo model: yoloedge demo --help)")
    p.add_argument("--cameras", type=int, default=64, help="synthetic cameras added per cycle (default 64)")
    p.add_argument("--size", default="1280x720", help="their frame size (default 1280x720)")
    p.add_argument("--fps", type=float, default=2, help="their frames per second (default 2)")
    p.add_argument("--frames", type=int, default=8, help="frames each camera delivers before removal (default 8)")
    p.add_argument("--cycles", type=int, default=6, help="add/remove cycles (default 6)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    binary = mosquitto_or_say("yoloedge bench reload")
    if binary is None:
        return 2
    cameras = [{"name": f"cam{i}", "url": f"synthetic://{args.size}?fps={args.fps:g}"} for i in range(args.cameras)]
    with tempfile.TemporaryDirectory(prefix="yoloedge-reload-") as tmp:
        workdir, port = Path(tmp), free_port()
        broker = start_broker(binary, workdir, port)
        accelerator = {"name": "cpu", "backend": "onnxruntime", "batch": 1}
        config = bench_config(workdir, port, {"path": str(Path(args.model).resolve())}, accelerator, [])
        try:
            with Daemon(workdir, config) as daemon:
                print(f"yoloedge bench reload: {args.cycles} cycles of 0 -> {args.cameras} -> 0 synthetic "
                      f"{args.size} cameras at {args.fps:g} fps, each delivering {args.frames} frames")
                print(f"  {'':24}{'RSS MB':>8}{'threads':>9}{'files':>7}")
                _row("start", sample_process(daemon.pid))
                for cycle in range(1, args.cycles + 1):
                    _reload(daemon, {**config, "cameras": cameras})
                    _wait_for_frames(daemon, args.frames)
                    _row(f"cycle {cycle}: with cameras", sample_process(daemon.pid))
                    _reload(daemon, config)
                    _row(f"cycle {cycle}: removed", _settled(daemon))
        finally:
            broker.terminate()
            broker.wait(10)
    return 0


def _row(label: str, sample: ProcSample) -> None:
    print(f"  {label:24}{sample.rss_mb:8.0f}{sample.threads:9d}{sample.fds:7d}")


def _reload(daemon: Daemon, config: dict) -> None:
    """Rewrite the daemon's file, SIGHUP, and wait for the new generation."""
    generation = daemon.status()["daemon"]["generation"]
    daemon.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.kill(daemon.pid, signal.SIGHUP)
    deadline = time.monotonic() + WAIT_S
    while (status := daemon.status())["daemon"]["generation"] == generation:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the reload was not applied within {WAIT_S:.0f} s")
        time.sleep(0.2)
    if status["daemon"]["config_error"]:
        raise RuntimeError(f"the reload was rejected: {status['daemon']['config_error']}")


def _settled(daemon: Daemon) -> ProcSample:
    """A sample once the removed cameras' threads are gone: the thread count stopped changing."""
    sample = sample_process(daemon.pid)
    deadline, stable_since = sample.at + WAIT_S, sample.at
    while sample.at - stable_since < STABLE_S and sample.at < deadline:
        time.sleep(0.2)
        previous, sample = sample, sample_process(daemon.pid)
        if sample.threads != previous.threads:
            stable_since = sample.at
    return sample


def _wait_for_frames(daemon: Daemon, frames: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while not all((camera.get("frames_in") or 0) >= frames for camera in daemon.status()["cameras"]):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cameras did not deliver {frames} frames within {WAIT_S:.0f} s")
        time.sleep(0.5)

"""`yoloedge bench e2e`: the whole daemon on ONNX Runtime CPU against a bare `session.run` loop.

Same model, same ONNX Runtime settings, same machine, one run: the bare loop runs the session on
one letterboxed frame of the clip as fast as it can (the most the runtime gives); the daemon reads
the clip losslessly (`realtime: false`, looping) and publishes every frame to a private mosquitto:
decode, letterbox, batching, inference, decode + NMS and MQTT. The two alternate for `--rounds`
rounds (bare, daemon, bare, daemon, ..., bare), and each daemon run is compared with the mean of
the bare runs just before and after it, so a machine whose speed drifts (a shared VM, thermal
limits) shows in both sides of every ratio; the median ratio is the result. With Ultralytics
installed, its `predict` on the same frames is a third line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2

from ..localbroker import HOST, INSTALL_HINT, find_mosquitto, free_port, start_broker
from .host import cpu_percent, sample_process
from .pipeline import DEVICE_ID, Daemon, Subscriber


def add_parser(bsub) -> None:
    p = bsub.add_parser("e2e", help="the daemon on ONNX Runtime CPU against a bare session.run loop",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="ONNX model")
    p.add_argument("--clip", required=True, help="video the daemon's camera reads (losslessly, looping)")
    p.add_argument("--seconds", type=float, default=20, help="measured time of each run (default 20)")
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: its default)")
    p.add_argument("--rounds", type=int, default=3, help="daemon runs, each between two bare runs (default 3)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    model, clip = str(Path(args.model).resolve()), str(Path(args.clip).resolve())
    for path in (model, clip):
        if not os.path.isfile(path):
            print(f"yoloedge bench e2e: no such file: {path}", file=sys.stderr)
            return 2
    binary = find_mosquitto()
    if binary is None:
        print(f"yoloedge bench e2e: needs the mosquitto MQTT broker ({INSTALL_HINT})", file=sys.stderr)
        return 2
    frame = _first_frame(clip)
    bares = [bare_loop(model, frame, args.seconds, args.threads)]
    daemons: list[tuple[float, float]] = []
    for _ in range(max(1, args.rounds)):
        with tempfile.TemporaryDirectory(prefix="yoloedge-e2e-") as tmp:
            daemons.append(daemon_run(model, clip, Path(tmp), binary, args.seconds, args.warmup, args.threads))
        bares.append(bare_loop(model, frame, args.seconds, args.threads))
    ultra = ultralytics_loop(model, clip, args.seconds)
    ratios = [fps / statistics.mean(bares[i:i + 2]) for i, (fps, _) in enumerate(daemons)]
    bare = statistics.median(bares)
    daemon_fps = statistics.median(fps for fps, _ in daemons)
    import onnxruntime as ort

    print(f"yoloedge bench e2e: {os.path.basename(model)} on ONNX Runtime {ort.__version__} CPU "
          f"({os.cpu_count()} cores, intra-op threads {args.threads or 'default'}), clip {os.path.basename(clip)}, "
          f"{len(daemons)} rounds of {args.seconds:g} s")
    print(f"  {'':42}{'frames/s':>9}  {'vs bare':>7}")
    print(f"  {'bare session.run loop (median)':42}{bare:9.2f}  {1:7.2f}x  runs: "
          + " ".join(f"{b:.2f}" for b in bares))
    print(f"  {'yoloedge daemon: decode -> ... -> MQTT':42}{daemon_fps:9.2f}  {statistics.median(ratios):7.2f}x  "
          f"runs: " + " ".join(f"{fps:.2f} ({r:.2f}x)" for (fps, _), r in zip(daemons, ratios))
          + f"; daemon CPU {statistics.median(c for _, c in daemons):.0f}%")
    if ultra is None:
        print(f"  {'Ultralytics predict':46}{'not installed':>9}")
    else:
        print(f"  {'Ultralytics predict (same clip)':46}{ultra:9.2f}  {ultra / bare:7.2f}x")
    return 0


def _first_frame(clip: str):
    cap = cv2.VideoCapture(clip)
    ok, frame = cap.read()
    cap.release()
    if not ok:
        raise SystemExit(f"yoloedge bench e2e: cannot decode {clip}")
    return frame


def bare_loop(model: str, frame, seconds: float, threads: int) -> float:
    """session.run on one letterboxed frame, back to back, with ONNX Runtime's default options."""
    import onnxruntime as ort

    from ..config import ModelConfig
    from ..detector import open_detector

    det = open_detector(ModelConfig(path=model), warm_up=False)
    det.preprocess([frame])
    feed = {det.spec.input.name: det.backend.input_buffer[:1].copy()}
    det.close()
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feed)
    runs, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        session.run(None, feed)
        runs += 1
    return runs / (time.monotonic() - started)


def daemon_run(model: str, clip: str, workdir: Path, binary: str, seconds: float, warmup: float,
               threads: int) -> tuple[float, float]:
    port = free_port()
    broker = start_broker(binary, workdir, port)
    accelerator = {"name": "cpu", "backend": "onnxruntime", "batch": 1, "intra_op_threads": threads}
    cfg = {
        "device_id": DEVICE_ID,
        "model": {"path": model},
        "accelerators": [accelerator],
        "cameras": [{"name": "clip", "url": clip, "realtime": False, "loop": True}],
        "mqtt": {"host": HOST, "port": port, "stats_interval_s": 3600},
        "control": {"socket": str(workdir / "control.sock")},
        "logging": {"level": "warning", "target": "stderr"},
        "shutdown_timeout_s": 10,
    }
    counter = Subscriber(port)
    try:
        with Daemon(workdir, cfg) as daemon:
            time.sleep(warmup)
            first = sample_process(daemon.pid)
            counter.open_window()
            time.sleep(seconds)
            counter.close_window()
            last = sample_process(daemon.pid)
    finally:
        counter.stop()
        broker.terminate()
        broker.wait(10)
    return sum(counter.per_camera.values()) / counter.window_s, cpu_percent(first, last)


def ultralytics_loop(model: str, clip: str, seconds: float) -> float | None:
    try:
        from ultralytics import YOLO
    except Exception:  # noqa: BLE001 - optional peer: any import failure means "not available"
        return None
    yolo = YOLO(model, task="detect")
    cap = cv2.VideoCapture(clip)
    frames, started = 0, time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            ok, frame = cap.read()
            if not ok:
                cap.release()
                cap = cv2.VideoCapture(clip)
                continue
            yolo.predict(frame, verbose=False)
            frames += 1
    finally:
        cap.release()
    return frames / (time.monotonic() - started)

"""`yoloedge bench e2e`: the whole daemon on ONNX Runtime CPU against a bare `session.run` loop.

Same model, same ONNX Runtime settings, same machine, one run: the bare loop runs the session on
one letterboxed frame of the clip as fast as it can (the most the runtime gives); the daemon reads
the clip losslessly (`realtime: false`, looping) and publishes every frame to a private mosquitto:
decode, letterbox, batching, inference, decode + NMS and MQTT.

The two alternate in short windows: the daemon is started once and frozen (SIGSTOP) while the bare
loop runs, then thawed and, after a settling second, measured; `--rounds` times, starting and
ending with a bare window. Each daemon window is compared with the mean of the bare windows just
before and after it, and the median of those ratios is the result: a shared VM's speed drifts (this
project's 2-core build machine switches between two speeds, one half the other, from one minute to
the next), and only windows close in time see the same machine. A daemon window whose two bare
neighbours differ by more than `STEADY` saw the machine change speed and is left out of the
median (it is still printed). With Ultralytics installed, its `predict` on the same frames is a
third line.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2

from ..localbroker import free_port, mosquitto_or_say, start_broker
from .host import sample_process
from .pipeline import SETTLE_S, STEADY, Daemon, Subscriber, bench_config, steady_ratios


def add_parser(bsub) -> None:
    p = bsub.add_parser("e2e", help="the daemon on ONNX Runtime CPU against a bare session.run loop",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="ONNX model")
    p.add_argument("--clip", required=True, help="video the daemon's camera reads (losslessly, looping)")
    p.add_argument("--seconds", type=float, default=6, help="length of each window (default 6)")
    p.add_argument("--rounds", type=int, default=8, help="daemon windows, each between two bare ones (default 8)")
    p.add_argument("--warmup", type=float, default=5)
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0: its default)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    model, clip = str(Path(args.model).resolve()), str(Path(args.clip).resolve())
    for path in (model, clip):
        if not os.path.isfile(path):
            print(f"yoloedge bench e2e: no such file: {path}", file=sys.stderr)
            return 2
    binary = mosquitto_or_say("yoloedge bench e2e")
    if binary is None:
        return 2
    bare = BareLoop(model, _first_frame(clip), args.threads)
    with tempfile.TemporaryDirectory(prefix="yoloedge-e2e-") as tmp:
        bares, daemons, cpu = alternate(bare, model, clip, Path(tmp), binary, args)
    ultra = ultralytics_loop(model, clip, args.seconds)
    ratios = [fps / statistics.mean(bares[i:i + 2]) for i, fps in enumerate(daemons)]
    steady = steady_ratios(daemons, bares)
    import onnxruntime as ort

    print(f"yoloedge bench e2e: {os.path.basename(model)} on ONNX Runtime {ort.__version__} CPU "
          f"({os.cpu_count()} cores, intra-op threads {args.threads or 'default'}), clip {os.path.basename(clip)}, "
          f"{len(daemons)} daemon windows of {args.seconds:g} s between bare ones")
    print(f"  {'':42}{'frames/s':>9}  {'vs bare':>7}")
    print(f"  {'bare session.run loop (median)':42}{statistics.median(bares):9.2f}  {1:7.2f}x  windows: "
          + " ".join(f"{b:.2f}" for b in bares))
    result = f"{statistics.median(steady):7.2f}x" if steady else "    n/a"
    print(f"  {'yoloedge daemon: decode -> ... -> MQTT':42}{statistics.median(daemons):9.2f}  {result}  windows: "
          + " ".join(f"{fps:.2f} ({r:.2f}x)" for fps, r in zip(daemons, ratios)) + f"; daemon CPU {cpu:.0f}%")
    print(f"  the ratio is the median over the {len(steady)} of {len(daemons)} daemon windows whose bare "
          f"neighbours agree within {100 * STEADY:.0f}%")
    if ultra is None:
        print(f"  {'Ultralytics predict':42}n/a (not installed: ultralytics)")
    else:
        print(f"  {'Ultralytics predict (same clip)':42}{ultra:9.2f}  {ultra / statistics.median(bares):7.2f}x")
    return 0


def _first_frame(clip: str):
    cap = cv2.VideoCapture(clip)
    ok, frame = cap.read()
    cap.release()
    if not ok:
        raise SystemExit(f"yoloedge bench e2e: cannot decode {clip}")
    return frame


class BareLoop:
    """session.run on one letterboxed frame, back to back, with ONNX Runtime's default options."""

    def __init__(self, model: str, frame, threads: int):
        import onnxruntime as ort

        from ..config import ModelConfig
        from ..pipeline.detector import open_detector

        det = open_detector(ModelConfig(path=model), warm_up=False)
        det.preprocess([frame])
        self.feed = {det.spec.input.name: det.backend.input_buffer[:1].copy()}
        det.close()
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(model, opts, providers=["CPUExecutionProvider"])
        for _ in range(3):
            self.session.run(None, self.feed)

    def fps(self, seconds: float) -> float:
        runs, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            self.session.run(None, self.feed)
            runs += 1
        return runs / (time.monotonic() - started)


def alternate(bare: BareLoop, model: str, clip: str, workdir: Path, binary: str,
              args: argparse.Namespace) -> tuple[list[float], list[float], float]:
    """bare, daemon, bare, daemon, ..., bare: frames/s of each window, and the daemon's CPU %."""
    port = free_port()
    broker = start_broker(binary, workdir, port)
    accelerator = {"name": "cpu", "backend": "onnxruntime", "batch": 1, "intra_op_threads": args.threads}
    cfg = bench_config(workdir, port, {"path": model}, accelerator,
                       [{"name": "clip", "url": clip, "realtime": False, "loop": True}])
    counter = Subscriber(port)
    bares: list[float] = []
    daemons: list[float] = []
    cpu_s = wall_s = 0.0
    try:
        with Daemon(workdir, cfg) as daemon:
            time.sleep(args.warmup)
            for _ in range(max(1, args.rounds)):
                bares.append(_frozen(daemon, bare, args.seconds))
                time.sleep(SETTLE_S)
                first, before = sample_process(daemon.pid), counter.total
                counter.open_window()
                time.sleep(args.seconds)
                window = counter.close_window()
                last = sample_process(daemon.pid)
                daemons.append((counter.total - before) / window)
                cpu_s, wall_s = cpu_s + last.cpu_s - first.cpu_s, wall_s + last.at - first.at
            bares.append(_frozen(daemon, bare, args.seconds))
    finally:
        counter.stop()
        broker.terminate()
        broker.wait(10)
    return bares, daemons, 100 * cpu_s / wall_s if wall_s else 0.0


def _frozen(daemon: Daemon, bare: BareLoop, seconds: float) -> float:
    """The bare loop's frames/s while the daemon is stopped (SIGSTOP), so it has the machine."""
    os.kill(daemon.pid, signal.SIGSTOP)
    try:
        return bare.fps(seconds)
    finally:
        os.kill(daemon.pid, signal.SIGCONT)


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

"""`yoloedge bench pipeline`: can this host keep a fast accelerator busy?

Runs the real daemon (a subprocess: readers -> queues -> preparers -> device worker -> post ->
MQTT to a private mosquitto) with N cameras feeding a simulated device of a chosen speed, and
prints, side by side from one run: what was offered and published, the device's utilisation
(busy / wall), drops, capture -> publish latency, per-camera fairness, the daemon's CPU, RSS,
threads and file descriptors, and the host's own decode + letterbox ceiling, measured right after
with plain OpenCV threads.

Cameras are synthetic (one pre-decoded frame at a set fps: decoding excluded) or, with `--clip`,
file cameras decoding a real clip (paced at its frame rate, or lossless with `--lossless`).

The measurement alternates: the ceiling threads run with the daemon frozen (SIGSTOP), then the
daemon runs again and is measured (after a settling second), `--rounds` times, ending with a last
ceiling window. On a machine whose speed drifts -- this project's 2-core build machine switches
between two speeds, one half the other -- each daemon window is compared with the ceiling windows
right before and after it; windows whose two ceilings disagree by more than 10% saw the machine
change speed and are left out of the median ratio, which is the result.
With `--sample S` it instead measures one long window, printing RSS, threads and fds every S
seconds (a soak test), and the ceiling once at the end.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import cv2
import yaml

from ..control.client import ControlError, request
from ..localbroker import HOST, free_port, mosquitto_or_say, start_broker
from .host import Ceiling, ProcSample, host_ceiling, sample_process

DEVICE_ID = "bench"
_LATENCY = re.compile(rb'"latency_ms":\s*([0-9.]+)')
#: after the daemon is thawed, frames captured before the freeze are flushed: not measured
SETTLE_S = 1.5
#: reference windows on either side of a measured one that differ by more than this fraction saw
#: the machine change speed: that measured window is not used for the ratio
STEADY = 0.10


def steady_ratios(measured: list[float], references: list[float]) -> list[float]:
    """measured[i] / mean(references[i], references[i + 1]), for the windows whose two references
    agree within STEADY (references has one entry more: one before every window, one after the last)."""
    ratios = []
    for i, value in enumerate(measured):
        before, after = references[i], references[i + 1]
        if before and after and abs(before - after) <= STEADY * max(before, after):
            ratios.append(value / ((before + after) / 2))
    return ratios


def add_parser(bsub) -> None:
    p = bsub.add_parser("pipeline", help="the daemon feeding a simulated device, against the host's ceiling",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="ONNX model; the simulated device returns its real outputs")
    p.add_argument("--image", help="image the outputs are recorded on and synthetic cameras show "
                                   "(default: a textured synthetic frame)")
    p.add_argument("--cameras", type=int, default=8)
    p.add_argument("--fps", type=float, default=50, help="frames/s per synthetic camera (default 50)")
    p.add_argument("--size", default="1920x1080", help="synthetic frame size WIDTHxHEIGHT (default 1920x1080)")
    p.add_argument("--clip", help="decode this video in every camera instead (paced at its frame rate)")
    p.add_argument("--lossless", action="store_true", help="with --clip: realtime: false, every frame")
    p.add_argument("--decode-threads", type=int, default=1, help="FFmpeg threads per camera with --clip")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--device-ms", default="4,2", help="BASE,PER_FRAME ms per inference (default 4,2: "
                                                      "batch 8 in 20 ms = 400 frames/s)")
    p.add_argument("--aipp", action="store_true", help="uint8 NHWC input, like an Ascend .om with AIPP")
    p.add_argument("--input-buffers", type=int, default=2)
    p.add_argument("--preprocess-threads", type=int, default=0)
    p.add_argument("--seconds", type=float, default=20, help="measured time (default 20)")
    p.add_argument("--warmup", type=float, default=5, help="seconds before measuring (default 5)")
    p.add_argument("--sample", type=float, default=0, help="print RSS/threads/fds every N s (soak)")
    p.add_argument("--ceiling-seconds", type=float, default=5,
                   help="host ceiling measurement per round (0: skip)")
    p.add_argument("--rounds", type=int, default=3, help="daemon/ceiling windows to alternate (default 3)")
    p.add_argument("--no-baseline", action="store_true", help="skip the run without cameras (per-camera memory)")
    p.set_defaults(func=main)


@dataclass
class Options:
    """The command line, parsed (its defaults are the argparse ones: stated once)."""

    model: str
    image: str | None
    cameras: int
    fps: float
    size: tuple[int, int]  # width, height
    clip: str | None
    lossless: bool
    decode_threads: int
    batch: int
    device_ms: tuple[float, float]
    aipp: bool
    input_buffers: int
    preprocess_threads: int
    seconds: float
    warmup: float
    sample: float
    ceiling_seconds: float
    rounds: int
    baseline: bool

    @property
    def device_fps(self) -> float:
        base, per_frame = self.device_ms
        return self.batch / (base + per_frame * self.batch) * 1000

    @property
    def offered_fps(self) -> float | None:
        if self.clip:
            return None if self.lossless else self.cameras * _clip_fps(self.clip)
        return self.cameras * self.fps


def main(args: argparse.Namespace) -> int:
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
        base, per_frame = (float(v) for v in args.device_ms.split(","))
    except ValueError:
        print("yoloedge bench pipeline: --size is WIDTHxHEIGHT and --device-ms is BASE,PER_FRAME", file=sys.stderr)
        return 2
    opts = Options(model=str(Path(args.model).resolve()), image=str(Path(args.image).resolve()) if args.image else None,
                   cameras=args.cameras, fps=args.fps, size=(width, height),
                   clip=str(Path(args.clip).resolve()) if args.clip else None, lossless=args.lossless,
                   decode_threads=args.decode_threads, batch=args.batch, device_ms=(base, per_frame),
                   aipp=args.aipp, input_buffers=args.input_buffers, preprocess_threads=args.preprocess_threads,
                   seconds=args.seconds, warmup=args.warmup, sample=args.sample,
                   ceiling_seconds=args.ceiling_seconds, rounds=max(1, args.rounds), baseline=not args.no_baseline)
    binary = mosquitto_or_say("yoloedge bench pipeline")
    if binary is None:
        return 2
    for path in filter(None, (opts.model, opts.image, opts.clip)):
        if not os.path.isfile(path):
            print(f"yoloedge bench pipeline: no such file: {path}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="yoloedge-bench-") as tmp:
        result = run(opts, Path(tmp), binary)
    print(report(opts, result))
    return 0


# -- the run ---------------------------------------------------------------------------------------
@dataclass
class Result:
    seconds: float = 0.0  # daemon windows, summed
    published: dict[str, int] = field(default_factory=dict)
    latencies_ms: list[float] = field(default_factory=list)
    busy_s: float = 0.0
    drops: int = 0
    frames_in: int = 0
    daemon_cpu_s: float = 0.0
    broker_cpu_s: float = 0.0
    bench_cpu_s: float = 0.0
    last: ProcSample | None = None
    samples: list[ProcSample] = field(default_factory=list)
    baseline: ProcSample | None = None
    ceilings: list[Ceiling] = field(default_factory=list)
    windows: list[float] = field(default_factory=list)  # published frames/s of each daemon window
    batch_p50: float | None = None

    @property
    def ceiling_fps(self) -> float | None:
        seconds = sum(c.seconds for c in self.ceilings)
        return sum(c.frames for c in self.ceilings) / seconds if seconds else None


def run(opts: Options, workdir: Path, binary: str) -> Result:
    port = free_port()
    broker = start_broker(binary, workdir, port)
    result = Result()
    try:
        if opts.baseline:
            result.baseline = _baseline(opts, workdir, port)
        _measure(opts, workdir, port, broker.pid, result)
    finally:
        broker.terminate()
        broker.wait(10)
    if opts.sample and opts.ceiling_seconds > 0:
        result.ceilings.append(_ceiling(opts, opts.ceiling_seconds))
    return result


def _ceiling(opts: Options, seconds: float) -> Ceiling:
    frame = None if opts.clip else _frame(opts)
    return host_ceiling(opts.cameras, seconds, _model_hw(opts.model), frame=frame, clip=opts.clip,
                        decode_threads=opts.decode_threads, nhwc=opts.aipp)


def _baseline(opts: Options, workdir: Path, port: int) -> ProcSample:
    """The daemon with the model loaded and no camera: what each camera adds is measured against it."""
    with Daemon(workdir, config(opts, workdir, port, cameras=0)) as daemon:
        time.sleep(2.0)
        return sample_process(daemon.pid)


def _measure(opts: Options, workdir: Path, port: int, broker_pid: int, result: Result) -> None:
    """Daemon windows, each followed (unless soaking) by a ceiling window with the daemon frozen."""
    soak = opts.sample > 0
    rounds = 1 if soak else opts.rounds
    interleave = not soak and opts.ceiling_seconds > 0
    counter = Subscriber(port)

    def frozen_ceiling(daemon: Daemon) -> None:
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            result.ceilings.append(_ceiling(opts, opts.ceiling_seconds))
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        time.sleep(SETTLE_S)

    try:
        with Daemon(workdir, config(opts, workdir, port, cameras=opts.cameras)) as daemon:
            time.sleep(opts.warmup)
            if interleave:
                frozen_ceiling(daemon)
            for _ in range(rounds):
                result.windows.append(_window(opts, daemon, broker_pid, counter, result, opts.seconds / rounds))
                if interleave:
                    frozen_ceiling(daemon)
            result.batch_p50 = daemon.status()["accelerators"][0].get("batch_p50")
    finally:
        counter.stop()
    result.published = counter.per_camera
    result.latencies_ms = counter.latencies


def _window(opts: Options, daemon: Daemon, broker_pid: int, counter: Subscriber, result: Result,
            seconds: float) -> float:
    """One measured window of the running daemon; adds its figures to `result`, returns frames/s."""
    status0 = daemon.status()
    first, broker0, bench0 = sample_process(daemon.pid), sample_process(broker_pid), sample_process(os.getpid())
    before = counter.total
    counter.open_window()
    result.samples.append(first)
    deadline = time.monotonic() + seconds
    next_sample = time.monotonic() + (opts.sample or seconds + 1)
    while time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        if opts.sample and time.monotonic() >= next_sample:
            result.samples.append(sample_process(daemon.pid))
            next_sample += opts.sample
    window_s = counter.close_window()
    last, broker1, bench1 = sample_process(daemon.pid), sample_process(broker_pid), sample_process(os.getpid())
    status1 = daemon.status()
    result.samples.append(last)
    result.last = last
    result.seconds += window_s
    result.daemon_cpu_s += last.cpu_s - first.cpu_s
    result.broker_cpu_s += broker1.cpu_s - broker0.cpu_s
    result.bench_cpu_s += bench1.cpu_s - bench0.cpu_s
    result.busy_s += (sum(a["busy_s"] for a in status1["accelerators"])
                      - sum(a["busy_s"] for a in status0["accelerators"]))
    cams0 = {c["name"]: c for c in status0["cameras"]}
    result.drops += sum(c["drops"] - cams0[c["name"]]["drops"] for c in status1["cameras"])
    result.frames_in += sum((c["frames_in"] or 0) - (cams0[c["name"]]["frames_in"] or 0) for c in status1["cameras"])
    return (counter.total - before) / window_s if window_s else 0.0


def config(opts: Options, workdir: Path, port: int, cameras: int) -> dict:
    width, height = opts.size
    simulated: dict = {"device_ms": list(opts.device_ms), "input": "aipp" if opts.aipp else "host"}
    if opts.image:
        simulated["image"] = opts.image
    cams = []
    for i in range(cameras):
        if opts.clip:
            cam = {"name": f"cam{i:02d}", "url": opts.clip, "loop": True, "decode_threads": opts.decode_threads}
            if opts.lossless:
                cam["realtime"] = False
        else:
            url = f"synthetic://{width}x{height}?fps={opts.fps:g}" + (f"&image={opts.image}" if opts.image else "")
            cam = {"name": f"cam{i:02d}", "url": url}
        cams.append(cam)
    accelerator = {"name": "sim", "backend": "simulated", "batch": opts.batch, "input_buffers": opts.input_buffers,
                   "preprocess_threads": opts.preprocess_threads, "simulated": simulated}
    return bench_config(workdir, port, {"path": opts.model, "input": "aipp" if opts.aipp else "host"},
                        accelerator, cams)


def bench_config(workdir: Path, port: int, model: dict, accelerator: dict, cameras: list[dict]) -> dict:
    """A daemon configuration for a benchmark: the private broker, a control socket in `workdir`,
    warnings only, and no stall detection to speak of -- the benchmarks freeze the daemon (SIGSTOP)
    between measuring windows, which is not a stall."""
    return {
        "device_id": DEVICE_ID,
        "model": model,
        "accelerators": [accelerator],
        "cameras": cameras,
        "mqtt": {"host": HOST, "port": port, "stats_interval_s": 3600},
        "health": {"stall_timeout_s": 120},
        "control": {"socket": str(workdir / "control.sock")},
        "logging": {"level": "warning", "target": "stderr"},
        "shutdown_timeout_s": 10,
    }


class Daemon:
    """`yoloedge run` as a subprocess, its own process (so /proc shows only the daemon)."""

    def __init__(self, workdir: Path, cfg: dict):
        self.workdir = workdir
        self.socket = cfg["control"]["socket"]
        self.config_path = workdir / "bench.yaml"
        self.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.log_path = workdir / "daemon.log"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Daemon:
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "yoloedge", "run", "-c", str(self.config_path)],
                                         env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}:\n{self.log_path.read_text()}")
            try:
                if request(self.socket, {"cmd": "status"})["daemon"]["state"] == "running":
                    return self
            except ControlError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the daemon did not start within 120 s:\n{self.log_path.read_text()}")

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else -1

    def status(self) -> dict:
        return request(self.socket, {"cmd": "status"}, timeout=10)

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class Subscriber:
    """Counts detection messages per camera and collects their capture -> publish latency, inside
    the measuring window only. Parses as little as it can: it shares the host with the daemon."""

    def __init__(self, port: int):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.per_camera: dict[str, int] = {}
        self.latencies: list[float] = []
        self.total = 0
        self._open = False
        self._opened = 0.0
        self.window_s = 0.0  # all windows together
        self._lock = threading.Lock()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="yoloedge-bench-subscriber")
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe(f"yoloedge/{DEVICE_ID}/cameras/+/detections", 0)
        self.client.on_subscribe = lambda *a: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(HOST, port)
        self.client.loop_start()
        if not self._subscribed.wait(10):
            raise RuntimeError("the bench's subscriber could not subscribe")

    def _on_message(self, client, userdata, message) -> None:
        if not self._open:
            return
        camera = message.topic.split("/")[-2]
        match = _LATENCY.search(message.payload)
        with self._lock:
            self.per_camera[camera] = self.per_camera.get(camera, 0) + 1
            self.total += 1
            if match:
                self.latencies.append(float(match.group(1)))

    def open_window(self) -> None:
        self._opened, self._open = time.monotonic(), True

    def close_window(self) -> float:
        """Stop counting; returns this window's length (added to `window_s`)."""
        self._open = False
        length = time.monotonic() - self._opened
        self.window_s += length
        return length

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


# -- inputs ----------------------------------------------------------------------------------------
def _frame(opts: Options):
    """The frame the host ceiling letterboxes: what the synthetic cameras deliver."""
    from ..sources.opening import open_source

    width, height = opts.size
    url = f"synthetic://{width}x{height}?fps=1000" + (f"&image={opts.image}" if opts.image else "")
    source = open_source(url)
    try:
        return source.read()
    finally:
        source.release()


def _model_hw(model: str) -> tuple[int, int]:
    from ..backends.onnxruntime import OnnxRuntimeBackend
    from ..model.spec import image_hwc

    backend = OnnxRuntimeBackend(model)
    try:
        height, width, _ = image_hwc(backend.open(1).input.shape)
    finally:
        backend.close()
    return height, width


def _clip_fps(path: str) -> float:
    cap = cv2.VideoCapture(path)
    try:
        return float(cap.get(cv2.CAP_PROP_FPS)) or 0.0
    finally:
        cap.release()


# -- the report ------------------------------------------------------------------------------------
def report(opts: Options, r: Result) -> str:
    width, height = opts.size
    if opts.clip:
        source = (f"{opts.cameras} file cameras decoding {os.path.basename(opts.clip)}"
                  + (" losslessly (realtime: false)" if opts.lossless else f" at {_clip_fps(opts.clip):.2f} fps"))
    else:
        source = f"{opts.cameras} synthetic cameras {width}x{height} @ {opts.fps:g} fps"
    base, per_frame = opts.device_ms
    lines = [
        f"yoloedge bench pipeline: {source}",
        f"  -> simulated device: batch {opts.batch}, {base:g} ms + {per_frame:g} ms/frame = "
        f"{opts.device_fps:.0f} frames/s, {'uint8 NHWC (AIPP)' if opts.aipp else 'float NCHW'} input, "
        f"{opts.input_buffers} input buffers; model {os.path.basename(opts.model)}",
        f"  host: {os.cpu_count()} cores; measured {r.seconds:.1f} s in {len(r.windows)} window(s) after "
        f"{opts.warmup:g} s of warm-up" + (", between ceiling windows with the daemon frozen"
                                           if len(r.ceilings) > len(r.windows) else ""),
        "",
    ]
    published = sum(r.published.values())
    rate = published / r.seconds if r.seconds else 0.0
    offered = opts.offered_fps
    ceiling = r.ceiling_fps
    target = min(opts.device_fps, ceiling) if ceiling else opts.device_fps
    rows = []
    if offered is not None:
        rows.append(("offered", f"{offered:8.1f} frames/s", ""))
    rows.append(("published", f"{rate:8.1f} frames/s",
                 (f"{100 * rate / offered:.1f}% of offered; " if offered else "")
                 + f"{100 * rate / target:.1f}% of min(device, host ceiling) = {target:.0f}"))
    if len(r.ceilings) == len(r.windows) + 1:
        targets = [min(opts.device_fps, c.fps) for c in r.ceilings]
        steady = steady_ratios(r.windows, targets)
        rows.append(("per window", f"{100 * statistics.median(steady):8.1f} % median" if steady else "     n/a",
                     f"of min(device, ceiling) in the {len(steady)} of {len(r.windows)} windows whose ceilings "
                     f"before and after agree within {100 * STEADY:.0f}%: "
                     + ", ".join(f"{p:.0f}/{c:.0f}" for p, c in zip(r.windows, targets))))
    rows.append(("device utilisation", f"{100 * r.busy_s / r.seconds if r.seconds else 0:8.1f} %",
                 f"busy/wall; median batch {r.batch_p50}"))
    rows.append(("dropped (keep-latest)", f"{r.drops / r.seconds if r.seconds else 0:8.1f} frames/s",
                 f"{r.drops} of {r.frames_in} read"))
    if r.latencies_ms:
        lat = sorted(r.latencies_ms)
        rows.append(("capture -> publish", f"{statistics.median(lat):8.1f} ms p50",
                     f"p99 {lat[min(len(lat) - 1, int(0.99 * len(lat)))]:.1f} ms, max {lat[-1]:.1f} ms"))
    if r.published:
        rates = [n / r.seconds for n in r.published.values()]
        spread = 100 * (max(rates) - min(rates)) / max(rates) if max(rates) else 0.0
        rows.append(("per camera published", f"{min(rates):8.1f} min", f"max {max(rates):.1f} frames/s "
                                                                      f"(spread {spread:.1f}%)"))
    if r.ceilings:
        first_ceiling = r.ceilings[0]
        rows.append(("host ceiling", f"{ceiling:8.1f} frames/s",
                     f"{first_ceiling.threads} plain OpenCV threads: {first_ceiling.what}"))
    last = r.last
    if last is not None and r.seconds:
        rows.append(("daemon CPU", f"{100 * r.daemon_cpu_s / r.seconds:8.1f} %",
                     f"of {100 * (os.cpu_count() or 1)}%; mosquitto {100 * r.broker_cpu_s / r.seconds:.1f}%, "
                     f"this bench's subscriber {100 * r.bench_cpu_s / r.seconds:.1f}%"))
        rows.append(("daemon memory", f"{last.rss_mb:8.1f} MB RSS", f"{last.threads} threads, {last.fds} fds"))
        if r.baseline and opts.cameras:
            rows.append(("per camera", f"{(last.rss_mb - r.baseline.rss_mb) / opts.cameras:8.1f} MB",
                         f"{(last.threads - r.baseline.threads) / opts.cameras:.1f} threads (against the daemon "
                         f"with no camera: {r.baseline.rss_mb:.0f} MB, {r.baseline.threads} threads)"))
    width_name = max(len(n) for n, _, _ in rows)
    lines += [f"  {name:<{width_name}}  {value}  {note}".rstrip() for name, value, note in rows]
    if opts.sample and len(r.samples) > 2:
        lines += ["", "  soak samples:      t s   RSS MB  threads  fds"]
        t0 = r.samples[0].at
        lines += [f"  {'':16}{s.at - t0:6.0f}  {s.rss_mb:7.1f}  {s.threads:7d}  {s.fds:4d}" for s in r.samples]
        first, last = r.samples[0], r.samples[-1]
        lines.append(f"  RSS growth after warm-up: {100 * (last.rss_mb - first.rss_mb) / first.rss_mb:+.2f}%; "
                     f"threads {first.threads} -> {last.threads}; fds {first.fds} -> {last.fds}")
    return "\n".join(lines)

"""`yoloedge bench memory`: what a decoded camera costs in memory, per codec, as users run it.

Makes a clip per codec from any video (as `bench clip` does, at `--size`, in a temporary folder
that is removed afterwards), or takes the clips given with `--clip`. Then it runs the real daemon
(a subprocess publishing to a private mosquitto, on a simulated device that returns the model's
real outputs) without cameras, and with `--cameras` file cameras of each clip at `fps: --fps`,
looping. A file camera decodes every frame at the clip's own rate and keeps the ones `fps` asks
for, as a camera sampled down would. After `--seconds` the daemon's RSS and threads are read from
/proc: per camera is (RSS with the cameras - RSS without) / cameras.

Next to it, "captures alone": the same sources (`sources.opening`), read by as many plain threads
at the same pace as in the daemon -- every frame grabbed, the kept ones retrieved into a buffer
of a shared `FramePool` -- in a process that has only imported OpenCV (and the `--decoder`'s
module): the decoder and its BGR pictures, without the pipeline. The difference is what
the pipeline adds per camera (its reader threads, the resized pictures, the snapshot keepsake).
With `--watch` every camera's snapshot is then asked for once, which makes the cameras *watched*
(full frames copied for the status page and `yoloedge-ctl snapshot`, see `pipeline.snapshots`),
and RSS is read again.

A benchmark, not a test: RSS depends on the allocator, the kernel (transparent huge pages), the
OpenCV and FFmpeg build, the clip (its reference frames) and the load, so it prints what this host
gives. Decode rates on a loaded host are lower, memory much less affected.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import cv2

from ..control.client import ControlError, request
from ..localbroker import free_port, mosquitto_or_say, start_broker
from .clips import CODEC_HINTS, CODECS, make_codec_clip
from .host import ProcSample, sample_process
from .pipeline import Daemon, bench_config

#: after the snapshots are asked for, the copies (2 a second) have both buffers well within this
WATCH_SETTLE_S = 2.0


def add_parser(bsub) -> None:
    p = bsub.add_parser("memory", help="RSS per decoded camera, per codec, in the real daemon",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="source", help="a video to make the clips from (scaled to --size)")
    src.add_argument("--clip", action="append", help="use this clip (repeat for several); no clip is made")
    p.add_argument("--model", required=True, help="ONNX model; the simulated device returns its real outputs")
    p.add_argument("--codecs", default=",".join(CODECS), help=f"with --from: clips to make (default "
                                                                f"{','.join(CODECS)})")
    p.add_argument("--size", default="1920x1080", help="with --from: WIDTHxHEIGHT (default 1920x1080)")
    p.add_argument("--cameras", type=int, default=8, help="file cameras per clip (default 8)")
    p.add_argument("--fps", type=float, default=5, help="each camera's `fps:` (default 5)")
    p.add_argument("--decode-threads", type=int, default=1, help="each camera's `decode_threads:` (default 1)")
    p.add_argument("--decoder", default="opencv", help="each camera's `decoder:` (default opencv; e.g. pyav)")
    p.add_argument("--batch", type=int, default=8, help="the simulated device's batch (default 8)")
    p.add_argument("--seconds", type=float, default=20, help="run this long before reading RSS (default 20)")
    p.add_argument("--watch", action="store_true", help="then ask every camera's snapshot and read RSS again")
    p.add_argument("--no-captures", action="store_true", help="skip the captures-alone runs")
    p.set_defaults(func=main)


@dataclass(frozen=True)
class Options:
    model: str
    cameras: int
    fps: float
    decode_threads: int
    batch: int
    seconds: float
    watch: bool
    captures: bool
    decoder: str = "opencv"


@dataclass(frozen=True)
class Clip:
    path: str
    codec: str  # as described by bench clip, or the file's FourCC


@dataclass
class Row:
    clip: Clip
    daemon: ProcSample
    read_fps: float  # frames decoded per second per camera
    watched: ProcSample | None = None
    captures: CaptureProbe | None = None


@dataclass(frozen=True)
class CaptureProbe:
    """What the captures-alone process reported: RSS before opening and while reading."""
    before_mb: float
    rss_mb: float
    threads_before: int
    threads: int
    frames: int


def main(args: argparse.Namespace) -> int:
    opts = Options(model=str(Path(args.model).resolve()), cameras=args.cameras, fps=args.fps,
                   decode_threads=args.decode_threads, batch=args.batch, seconds=args.seconds,
                   watch=args.watch, captures=not args.no_captures, decoder=args.decoder)
    problem = _problem(args, opts)
    if problem:
        print(f"yoloedge bench memory: {problem}", file=sys.stderr)
        return 2
    binary = mosquitto_or_say("yoloedge bench memory")
    if binary is None:
        return 2
    with tempfile.TemporaryDirectory(prefix="yoloedge-bench-memory-") as tmp:
        workdir = Path(tmp)
        clips, missing = _clips(args, workdir)
        if not clips:
            print(f"yoloedge bench memory: no clip could be made: {'; '.join(missing)}", file=sys.stderr)
            return 1
        baseline, rows = run(opts, clips, workdir, binary)
    print(report(opts, baseline, rows, missing, source=args.source))
    return 0


def _problem(args: argparse.Namespace, opts: Options) -> str | None:
    if opts.cameras < 1 or opts.fps <= 0 or opts.seconds <= 0 or opts.decode_threads < 0 or opts.batch < 1:
        return "--cameras and --batch are at least 1, --fps and --seconds more than 0, --decode-threads 0 or more"
    from ..config.sources import DECODERS
    if opts.decoder not in DECODERS:
        return f"--decoder takes {', '.join(DECODERS)}"
    for path in [opts.model, args.source, *(args.clip or [])]:
        if path and not os.path.isfile(path):
            return f"no such file: {path}"
    if args.source:
        try:
            width, height = (int(v) for v in args.size.lower().split("x"))
        except ValueError:
            return "--size is WIDTHxHEIGHT"
        unknown = [c for c in _codecs(args.codecs) if c not in CODECS]
        if unknown or not _codecs(args.codecs) or width < 16 or height < 16:
            return f"--codecs takes {', '.join(CODECS)}; --size at least 16x16"
    return None


def _codecs(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _clips(args: argparse.Namespace, workdir: Path) -> tuple[list[Clip], list[str]]:
    """The clips to run, and why the ones asked for but not made were not."""
    if args.clip:
        return [Clip(str(Path(p).resolve()), _fourcc(p)) for p in args.clip], []
    width, height = (int(v) for v in args.size.lower().split("x"))
    clips, missing = [], []
    for codec in _codecs(args.codecs):
        path = workdir / f"{codec}_{width}x{height}.mp4"
        made = make_codec_clip(args.source, str(path), width, height, codec)
        if made is None:
            missing.append(f"{codec}: {CODEC_HINTS[codec]}")
        else:
            clips.append(Clip(str(path), made))
    return clips, missing


def _fourcc(path: str) -> str:
    cap = cv2.VideoCapture(path)
    try:
        code = int(cap.get(cv2.CAP_PROP_FOURCC))
    finally:
        cap.release()
    text = "".join(chr((code >> (8 * i)) & 0xFF) for i in range(4)).strip("\0 ")
    return f"{os.path.basename(path)} ({text or 'codec unknown'})"


# -- the runs --------------------------------------------------------------------------------------
def run(opts: Options, clips: list[Clip], workdir: Path, binary: str) -> tuple[ProcSample, list[Row]]:
    port = free_port()
    broker = start_broker(binary, workdir, port)
    try:
        with Daemon(workdir, _config(opts, workdir, port, None)) as daemon:
            time.sleep(opts.seconds)
            baseline = sample_process(daemon.pid)
        rows = [_measure(opts, clip, workdir, port) for clip in clips]
    finally:
        broker.terminate()
        broker.wait(10)
    if opts.captures:
        for row in rows:
            row.captures = captures_alone(row.clip.path, opts)
    return baseline, rows


def _config(opts: Options, workdir: Path, port: int, clip: Clip | None) -> dict:
    cameras = [] if clip is None else [
        {"name": f"cam{i:02d}", "url": clip.path, "loop": True, "fps": opts.fps, "decode_threads": opts.decode_threads,
         "decoder": opts.decoder} for i in range(opts.cameras)]
    accelerator = {"name": "sim", "backend": "simulated", "batch": opts.batch, "simulated": {"device_ms": [4, 2]}}
    return bench_config(workdir, port, {"path": opts.model}, accelerator, cameras)


def _measure(opts: Options, clip: Clip, workdir: Path, port: int) -> Row:
    with Daemon(workdir, _config(opts, workdir, port, clip)) as daemon:
        frames0, started = _frames_in(daemon), time.monotonic()
        time.sleep(opts.seconds)
        sample = sample_process(daemon.pid)
        read_fps = (_frames_in(daemon) - frames0) / (time.monotonic() - started) / opts.cameras
        row = Row(clip, sample, read_fps)
        if opts.watch:
            _watch_all(daemon, opts.cameras)
            time.sleep(WATCH_SETTLE_S)
            row.watched = sample_process(daemon.pid)
    return row


def _frames_in(daemon: Daemon) -> int:
    return sum(c.get("frames_in") or 0 for c in daemon.status()["cameras"])


def _watch_all(daemon: Daemon, cameras: int) -> None:
    for i in range(cameras):
        try:
            request(daemon.socket, {"cmd": "snapshot", "camera": f"cam{i:02d}"}, timeout=30)
        except ControlError as exc:
            raise RuntimeError(f"snapshot of cam{i:02d}: {exc}") from exc


# -- captures alone --------------------------------------------------------------------------------
def captures_alone(clip: str, opts: Options) -> CaptureProbe:
    """The cameras' sources without the daemon, in a fresh process (see the module docstring)."""
    command = [sys.executable, "-m", "yoloedge.bench.memory", clip, str(opts.cameras), str(opts.seconds),
               str(opts.decode_threads), str(opts.fps), opts.decoder]
    result = subprocess.run(command, capture_output=True, text=True, timeout=opts.seconds + 120)
    if result.returncode != 0:
        raise RuntimeError(f"the captures-alone process failed:\n{result.stderr}")
    return CaptureProbe(**json.loads(result.stdout.strip().splitlines()[-1]))


def _probe(clip: str, cameras: int, seconds: float, decode_threads: int, fps: float, decoder: str) -> dict:
    """In the fresh process: open `cameras` sources of `clip`, and read them paced at the clip's
    rate from as many threads for `seconds` as the daemon's readers do: every frame grabbed, the
    ones `fps` keeps retrieved into a buffer of a shared pool and given back at once, each opened
    with `decoder` as the daemon opens it. Reports RSS before opening and while reading."""
    from ..config.schema import CameraConfig
    from ..sources.framepool import FramePool
    from ..sources.opening import open_camera
    from ..sources.delivery import IndexSampler

    before = sample_process(os.getpid())
    sources = [open_camera(CameraConfig(name=f"cam{i:02d}", url=clip, loop=True, decode_threads=decode_threads,
                                        decoder=decoder), camera=f"cam{i:02d}", reuse_frame=True)[0]
               for i in range(cameras)]
    pool = FramePool()
    stop = threading.Event()
    counts = [0] * cameras

    def read(index: int) -> None:
        source = sources[index]
        clip_fps = source.nominal_fps or 25.0
        sampler = IndexSampler(clip_fps, min(fps, clip_fps))
        start = time.monotonic()
        while not stop.is_set() and source.grab():
            size = source.grabbed_size()
            if size is not None and sampler.keep(counts[index], 0.0):
                lent = pool.take((size[1], size[0], 3)) if source.fills_buffers else None
                source.retrieve(lent)
                if lent is not None:
                    pool.give(lent)
            counts[index] += 1
            delay = start + counts[index] / clip_fps - time.monotonic()
            if delay > 0:
                stop.wait(delay)

    threads = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(cameras)]
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    during = sample_process(os.getpid())
    stop.set()
    for thread in threads:
        thread.join(30)
    for source in sources:
        source.release()
    return {"before_mb": before.rss_mb, "rss_mb": during.rss_mb, "threads_before": before.threads,
            "threads": during.threads, "frames": sum(counts)}


# -- the report ------------------------------------------------------------------------------------
def report(opts: Options, baseline: ProcSample, rows: list[Row], missing: list[str], source: str | None) -> str:
    made = f"; clips made from {os.path.basename(source)}" if source else ""
    lines = [
        f"yoloedge bench memory: {opts.cameras} file camera{'s' if opts.cameras != 1 else ''} per clip at fps "
        f"{opts.fps:g}, decoder {opts.decoder}, decode_threads "
        f"{opts.decode_threads}, RSS after {opts.seconds:g} s{made}",
        f"  host: {os.cpu_count()} cores; the daemon without cameras: {baseline.rss_mb:.1f} MB RSS, "
        f"{baseline.threads} threads",
        "",
    ]
    header = ["codec", "decoded/s", "daemon RSS", "per camera", "threads", "captures alone"]
    if opts.watch:
        header.append("watched")
    table = [header] + [_cells(opts, baseline, row) for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    for cells in table:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                                      enumerate(zip(cells, widths))).rstrip())
    lines += ["", "  decoded/s: frames each camera decoded per second; per camera and threads: against the daemon "
                  "without cameras;",
              "  captures alone: the same sources read by plain threads in a process that only imported OpenCV "
              "(and the decoder's module)"
              + ("; watched: per camera after every camera's snapshot was asked for" if opts.watch else "")]
    lines += [f"  not run: {why}" for why in missing]
    return "\n".join(lines)


def _cells(opts: Options, baseline: ProcSample, row: Row) -> list[str]:
    per_camera = (row.daemon.rss_mb - baseline.rss_mb) / opts.cameras
    threads = (row.daemon.threads - baseline.threads) / opts.cameras
    cells = [row.clip.codec, f"{row.read_fps:.1f}", f"{row.daemon.rss_mb:.1f} MB", f"{per_camera:.1f} MB",
             f"{threads:.1f}/camera"]
    probe = row.captures
    cells.append("-" if probe is None else f"{(probe.rss_mb - probe.before_mb) / opts.cameras:.1f} MB")
    if opts.watch:
        watched = row.watched
        cells.append("-" if watched is None else f"{(watched.rss_mb - baseline.rss_mb) / opts.cameras:.1f} MB")
    return cells


if __name__ == "__main__":  # the captures-alone process: CLIP CAMERAS SECONDS DECODE_THREADS FPS DECODER
    clip_arg, cameras_arg, seconds_arg, threads_arg, fps_arg, decoder_arg = sys.argv[1:7]
    print(json.dumps(_probe(clip_arg, int(cameras_arg), float(seconds_arg), int(threads_arg), float(fps_arg),
                            decoder_arg)))

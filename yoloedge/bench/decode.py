"""`yoloedge bench decode`: one video through every camera decoder, side by side.

Each decoder reads the whole clip through the camera source the daemon uses (`sources.gstreamer.
open_camera`, lossless as `realtime: false`), so the figures include what the daemon pays to get
a BGR frame: demux, decode, colour conversion and, for the hardware decoders, the copy out of
device memory. Wall time shows how fast one camera can go; CPU time per frame is what many cameras
cost the host, which is the point of moving decode to the hardware. Every decoder runs `--rounds`
times, interleaved, and the best round is shown, so a busy machine penalises them alike.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from dataclasses import dataclass

from ..config import CameraConfig
from ..errors import YoloedgeError
from ..redact import SECRETS, redact_text, redact_value
from ..sources.gstlaunch import Decoder

DEFAULT_DECODERS = "opencv,gstreamer,auto"


@dataclass(frozen=True)
class Round:
    decoder: str  # as asked
    used: str  # as resolved (auto)
    frames: int
    wall_s: float
    cpu_s: float


def add_parser(bsub) -> None:
    p = bsub.add_parser("decode", help="one video through each camera decoder (OpenCV, GStreamer, hardware)",
                        description=__doc__.splitlines()[0])
    p.add_argument("--clip", required=True, help="a video file (an rtsp:// URL works too, with --frames)")
    p.add_argument("--decoders", default=DEFAULT_DECODERS,
                   help=f"comma-separated camera `decoder:` values (default {DEFAULT_DECODERS}); "
                        f"choices: {', '.join(d.value for d in Decoder)}")
    p.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: the whole clip)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per decoder, best shown (default 3)")
    p.set_defaults(func=run)


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_all(clip: str, decoder: str, limit: int) -> Round:
    """Read `clip` to its end (or `limit` frames) with one decoder; CPU time is the whole process's
    (decoder threads included), so nothing else may run meanwhile."""
    from ..sources.gstreamer import open_camera

    config = CameraConfig(name="bench", url=clip, decoder=decoder, realtime=False if os.path.exists(clip) else None,
                          read_timeout_s=30, open_timeout_s=30)
    wall, cpu = time.perf_counter(), process_cpu_s()
    source, used = open_camera(config, camera="bench")
    frames = 0
    try:
        while not limit or frames < limit:
            image = source.read()
            if image is None:
                if source.eof or source.error:
                    break
                continue
            frames += 1
        if source.error and not frames:
            raise YoloedgeError(f"decoder {decoder}: {source.error}")
    finally:
        source.release()
    return Round(decoder, used.value, frames, time.perf_counter() - wall, process_cpu_s() - cpu)


def best_rounds(clip: str, decoders: list[str], rounds: int, limit: int) -> list[Round | str]:
    """The fastest round of each decoder (or why it could not run), decoders interleaved per round."""
    results: dict[str, list[Round]] = {d: [] for d in decoders}
    failures: dict[str, str] = {}
    for _ in range(rounds):
        for decoder in decoders:
            if decoder in failures:
                continue
            try:
                results[decoder].append(read_all(clip, decoder, limit))
            except YoloedgeError as exc:
                failures[decoder] = str(exc)
    return [failures[d] if d in failures else min(results[d], key=lambda r: r.wall_s) for d in decoders]


def format_rows(decoders: list[str], best: list[Round | str]) -> str:
    lines = [f"  {'decoder':<12}{'used':<11}{'frames':>7}{'frames/s':>10}{'CPU ms/frame':>14}{'wall s':>8}"]
    for decoder, result in zip(decoders, best):
        if isinstance(result, str):
            lines.append(f"  {decoder:<12}{'-':<11}  not available here: {redact_text(result)}")
            continue
        fps = result.frames / result.wall_s if result.wall_s > 0 else 0.0
        per_frame = result.cpu_s * 1000 / result.frames if result.frames else 0.0
        lines.append(f"  {decoder:<12}{result.used:<11}{result.frames:>7}{fps:>10.0f}{per_frame:>14.2f}"
                     f"{result.wall_s:>8.2f}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    SECRETS.add_url(args.clip)
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    known = {d.value for d in Decoder}
    unknown = [d for d in decoders if d not in known]
    if unknown or not decoders or args.rounds < 1 or args.frames < 0:
        print(f"yoloedge bench decode: --decoders takes {', '.join(sorted(known))}; --rounds >= 1, --frames >= 0",
              file=sys.stderr)
        return 2
    best = best_rounds(args.clip, decoders, args.rounds, args.frames)
    print(f"{redact_value(args.clip)}: best of {args.rounds} round(s), one camera, lossless, {os.cpu_count()} CPUs")
    print(format_rows(decoders, best))
    return 0 if any(not isinstance(r, str) for r in best) else 1

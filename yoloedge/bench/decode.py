"""`yoloedge bench decode`: one video through every camera decoder, side by side.

Each decoder reads the whole clip through the camera source the daemon uses (`sources.opening.
open_camera`, lossless as `realtime: false`), so the figures include what the daemon pays to get
a BGR frame: demux, decode, colour conversion and, for the hardware decoders, the copy out of
device memory. Wall time shows how fast one camera can go; CPU time per frame is what many cameras
cost the host, which is the point of moving decode to the hardware. Every decoder runs `--rounds`
times, interleaved, and the best round is shown, so a busy machine penalises them alike.
`--decode-threads 1,2` runs each decoder with each FFmpeg thread count (`decode_threads:`), to
weigh one camera's decode rate against the threads and memory more of them cost.
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
from ..config.sources import Decoder

DEFAULT_DECODERS = "opencv,gstreamer,auto"


@dataclass(frozen=True)
class Round:
    decoder: str  # as asked
    used: str  # as resolved (auto)
    frames: int
    wall_s: float
    cpu_s: float
    threads: int = 1  # decode_threads asked for


def add_parser(bsub) -> None:
    p = bsub.add_parser("decode", help="one video through each camera decoder (OpenCV, GStreamer, hardware)",
                        description=__doc__.splitlines()[0])
    p.add_argument("--clip", required=True, help="a video file (an rtsp:// URL works too, with --frames)")
    p.add_argument("--decoders", default=DEFAULT_DECODERS,
                   help=f"comma-separated camera `decoder:` values (default {DEFAULT_DECODERS}); "
                        f"choices: {', '.join(d.value for d in Decoder)}")
    p.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: the whole clip)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per decoder, best shown (default 3)")
    p.add_argument("--decode-threads", default="1",
                   help="comma-separated `decode_threads:` values to run each decoder with (default 1; "
                        "0: OpenCV's default, one per core)")
    p.set_defaults(func=run)


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_all(clip: str, decoder: str, limit: int, threads: int = 1, card=None) -> Round:
    """Read `clip` to its end (or `limit` frames) with one decoder; CPU time is the whole process's
    (decoder threads included), so nothing else may run meanwhile."""
    from ..sources.opening import open_camera

    config = CameraConfig(name="bench", url=clip, decoder=decoder, realtime=False if os.path.exists(clip) else None,
                          read_timeout_s=30, open_timeout_s=30, decode_threads=threads)
    wall, cpu = time.perf_counter(), process_cpu_s()
    media = card.for_camera("bench", lossless=True) if card is not None and decoder == Decoder.DVPP.value else None
    try:
        source, used = open_camera(config, camera="bench", media=media)
    except BaseException:
        if media is not None:
            card.remove_camera("bench")
        raise
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
        if media is not None:
            card.remove_camera("bench")  # its decoder channel: the next round opens its own
    return Round(decoder, used.value, frames, time.perf_counter() - wall, process_cpu_s() - cpu, threads)


def _card_media():
    """`dvpp`: the media engine of Ascend device 0, opened once (pyACL initialises once per
    process); each round opens its own decoder channel, as a camera does. The figures are VDEC's
    decode plus what the host pays around it: the demux and the hand-over of each access unit.
    Against the fake pyACL (tests/fakes on PYTHONPATH) the card's decode is PyAV's on this CPU,
    so only the host side means anything there."""
    from ..config.schema import AcceleratorConfig
    from ..pipeline.media import GroupMedia, MediaError
    try:
        import acl  # noqa: F401  (CANN's pyACL: the card's decoder)
    except ImportError as exc:
        raise YoloedgeError(f"decoder dvpp needs CANN's pyACL (import acl failed: {exc})") from None
    media = GroupMedia("bench", AcceleratorConfig(name="bench", backend="ascend", devices=(0,)))
    try:
        media.for_camera("probe")  # opens the card: fails here, not in the middle of a round
        media.remove_camera("probe")
    except MediaError as exc:
        media.close()
        raise YoloedgeError(str(exc)) from None
    return media


def best_rounds(clip: str, decoders: list[str], rounds: int, limit: int,
                threads: tuple[int, ...] = (1,)) -> list[Round | str]:
    """The fastest round of each decoder and thread count (or why the decoder could not run), in
    that order (decoder-major), all of them interleaved in every round."""
    runs = [(d, t) for d in decoders for t in threads]
    results: dict[tuple[str, int], list[Round]] = {run: [] for run in runs}
    failures: dict[str, str] = {}
    card = None
    if Decoder.DVPP.value in decoders:
        try:
            card = _card_media()
        except YoloedgeError as exc:
            failures[Decoder.DVPP.value] = str(exc)
    try:
        for _ in range(rounds):
            for decoder, count in runs:
                if decoder in failures:
                    continue
                try:
                    results[(decoder, count)].append(read_all(clip, decoder, limit, count, card))
                except YoloedgeError as exc:
                    failures[decoder] = str(exc)
    finally:
        if card is not None:
            card.close()
    return [failures[d] if d in failures else min(results[(d, t)], key=lambda r: r.wall_s) for d, t in runs]


def format_rows(best: list[Round | str], decoders: list[str], threads: tuple[int, ...] = (1,)) -> str:
    """One line per decoder and thread count (the order of `best_rounds`)."""
    lines = [f"  {'decoder':<12}{'used':<11}{'frames':>7}{'frames/s':>10}{'CPU ms/frame':>14}{'wall s':>8}"
             f"{'threads':>9}"]
    runs = [(d, t) for d in decoders for t in threads]
    for (decoder, _), result in zip(runs, best):
        if isinstance(result, str):
            lines.append(f"  {decoder:<12}{'-':<11}  not available here: {redact_text(result)}")
            continue
        fps = result.frames / result.wall_s if result.wall_s > 0 else 0.0
        per_frame = result.cpu_s * 1000 / result.frames if result.frames else 0.0
        lines.append(f"  {decoder:<12}{result.used:<11}{result.frames:>7}{fps:>10.0f}{per_frame:>14.2f}"
                     f"{result.wall_s:>8.2f}{result.threads or 'default':>9}")
    return "\n".join(dict.fromkeys(lines))  # a decoder that is not available: said once


def run(args: argparse.Namespace) -> int:
    SECRETS.add_url(args.clip)
    decoders = [d.strip() for d in args.decoders.split(",") if d.strip()]
    known = {d.value for d in Decoder}
    unknown = [d for d in decoders if d not in known]
    try:
        threads = tuple(int(t) for t in args.decode_threads.split(","))
    except ValueError:
        threads = ()
    if unknown or not decoders or args.rounds < 1 or args.frames < 0 or not threads or min(threads) < 0:
        print(f"yoloedge bench decode: --decoders takes {', '.join(sorted(known))}; --rounds >= 1, --frames >= 0, "
              f"--decode-threads N[,N...] with N >= 0", file=sys.stderr)
        return 2
    best = best_rounds(args.clip, decoders, args.rounds, args.frames, threads)
    print(f"{redact_value(args.clip)}: best of {args.rounds} round(s), one camera, lossless, {os.cpu_count()} CPUs")
    print(format_rows(best, decoders, threads))
    return 0 if any(not isinstance(r, str) for r in best) else 1

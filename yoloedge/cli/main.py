"""`yoloedge`: the daemon's command line. Sub-commands live in their own modules.

They are imported by `build_parser`, not here: `main` first holds back the daemon's signals
(see `cli.run`), and the sub-commands pull in OpenCV and NumPy, a quarter of a second during
which a SIGHUP would otherwise kill `yoloedge run`.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import MutableMapping

from .. import MAX_IMAGE_PIXELS, __version__
from . import run

#: sysexits.h EX_USAGE-style codes used across the CLI.
EXIT_OK = 0
EXIT_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    from ..demo import runner as demo
    from . import ascend_env, bench, check, convert, detect, quantize, verify

    parser = argparse.ArgumentParser(
        prog="yoloedge",
        description="YOLO object detection on camera streams at the edge, published over MQTT.")
    parser.add_argument("--version", action="version", version=f"yoloedge {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    run.add_parser(sub)
    check.add_parser(sub)
    detect.add_parser(sub)
    bench.add_parser(sub)
    convert.add_parser(sub)
    verify.add_parser(sub)
    quantize.add_parser(sub)
    demo.add_parser(sub)
    ascend_env.add_parser(sub)
    return parser


def cap_opencv_decoders(environ: MutableMapping[str, str]) -> None:
    """Lower OpenCV's own decoder cap (2^30 pixels) to MAX_IMAGE_PIXELS, unless the operator set it.

    The backstop for an image format whose header `sources.imagesize` does not read. OpenCV reads
    the variable once, when cv2 is loaded, so it is set here, before any sub-command imports cv2.
    """
    environ.setdefault("OPENCV_IO_MAX_IMAGE_PIXELS", str(MAX_IMAGE_PIXELS))


def main(argv: list[str] | None = None) -> int:
    previous_mask = run.hold_daemon_signals()
    cap_opencv_decoders(os.environ)
    try:
        args = build_parser().parse_args(argv)
    except BaseException:  # --help, --version, a usage error: leave the mask as found
        run.release_daemon_signals(previous_mask)
        raise
    if args.func is not run.run:
        run.release_daemon_signals(previous_mask)
    from ..health.logsetup import make_handler

    level = logging.WARNING - 10 * min(args.verbose, 2)
    # the daemon's stderr handler (redacting, control characters escaped) until `run` sets up its own
    logging.basicConfig(level=level, handlers=[make_handler("stderr", {})])
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())

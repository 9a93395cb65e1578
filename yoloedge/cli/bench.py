"""`yoloedge bench`: side-by-side timings (not tests) for docs/benchmarks.md."""

from __future__ import annotations

import argparse
import sys

import cv2
import numpy as np

from ..errors import YoloedgeError
from ..redact import SECRETS, redact_text, redact_value
from ..sources.imagesize import read_image


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks: ours next to plain OpenCV, torchvision, bare ORT",
                       description="Side-by-side timings (not tests): each stage or the whole daemon next to "
                                   "what it replaces, measured in one run on this host. `yoloedge bench KIND "
                                   "--help` describes each kind.")
    bsub = p.add_subparsers(dest="bench", metavar="KIND")
    bsub.required = True
    micro = bsub.add_parser("micro", help="letterbox and decode+NMS micro-benchmarks",
                            description="Times the letterbox into the model's input buffer against plain "
                                        "OpenCV resize+pad+transpose and cv2.dnn.blobFromImage, and the v8 "
                                        "decode + NMS on the model's real output against NumPy + "
                                        "cv2.dnn.NMSBoxesBatched and (when installed) torchvision, and the "
                                        "tracker's update for a frame of 20 objects. Medians "
                                        "and 90th percentiles in ms over --repeat runs after a warm-up.")
    micro.add_argument("--model", required=True,
                       help="a v8-layout ONNX model at 640 (its real output feeds the decode benchmark)")
    micro.add_argument("--image", help="image to use (default: a synthetic textured frame)")
    micro.add_argument("--width", type=int, default=1920, help="frame width for letterbox (default 1920)")
    micro.add_argument("--height", type=int, default=1080, help="frame height (default 1080)")
    micro.add_argument("--repeat", type=int, default=300, help="timed runs per row (default 300)")
    micro.set_defaults(func=run_micro)
    model = bsub.add_parser("model", help="whole detect() against the bare ONNX Runtime session",
                            description="Times yoloedge's whole detect() (letterbox, run, decode, NMS) and "
                                        "its backend.run alone against a bare ONNX Runtime session.run on "
                                        "the same input, on the CPU: what yoloedge adds around the model.")
    model.add_argument("--model", required=True, help="an ONNX detection model")
    model.add_argument("--image", help="image to use (default: synthetic)")
    model.add_argument("--repeat", type=int, default=30, help="timed runs per row (default 30)")
    model.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ORT default)")
    model.set_defaults(func=run_model)
    from ..bench import clips, decode, e2e, memory, pipeline, reload

    pipeline.add_parser(bsub)
    e2e.add_parser(bsub)
    clips.add_parser(bsub)
    decode.add_parser(bsub)
    memory.add_parser(bsub)
    reload.add_parser(bsub)


def _frame(path: str | None, width: int, height: int) -> np.ndarray:
    if path:
        img = read_image(path)  # ImageError is a YoloedgeError
    else:
        rng = np.random.default_rng(0)
        img = cv2.GaussianBlur(rng.integers(0, 255, (height // 4, width // 4, 3), dtype=np.uint8), (5, 5), 0)
    return cv2.resize(img, (width, height), interpolation=cv2.INTER_LINEAR)


def _register(args: argparse.Namespace) -> None:
    """The secrets of a URL given for a path, registered before any message can quote it."""
    for arg in (args.model, args.image):
        if arg:
            SECRETS.add_url(arg)


def _complain(exc: Exception) -> int:
    print(redact_text(f"yoloedge bench: {exc}"), file=sys.stderr)
    return 2


def run_micro(args: argparse.Namespace) -> int:
    from ..bench.micro import bench_decode_nms, bench_event_shot, bench_letterbox, bench_tracking, format_table
    from ..config import ModelConfig
    from ..pipeline.detector import open_detector

    _register(args)
    try:
        frame = _frame(args.image, args.width, args.height)
        det = open_detector(ModelConfig(path=args.model, conf=0.25))
    except YoloedgeError as exc:
        return _complain(exc)
    if det.layout.format != "v8" or det.input.height != 640:
        print("yoloedge bench micro: needs a v8-layout model with a 640 input", file=sys.stderr)
        return 2
    print(f"frame {frame.shape[1]}x{frame.shape[0]} -> {det.input.width}x{det.input.height}, "
          f"{args.repeat} runs each, opencv {cv2.__version__}, numpy {np.__version__}")
    print(format_table("letterbox into the model's input buffer", bench_letterbox(frame, 640, args.repeat)))
    det.preprocess([frame])
    output = det.infer(1)[0][0].copy()
    print(format_table("v8 decode + NMS on a real 640 output (conf 0.25, IoU 0.45)",
                       bench_decode_nms(output, 0.25, 0.45, args.repeat)))
    print(format_table("an event's best shot, at most once a second per event",
                       bench_event_shot(frame, max(10, args.repeat // 10))))
    det.close()
    print(format_table("tracking per frame (ByteTrack; 20 moving objects, 5 low-score candidates)",
                       bench_tracking(args.repeat)))
    return 0


def run_model(args: argparse.Namespace) -> int:
    from ..bench.micro import bench_model, format_table

    _register(args)
    try:
        frame = _frame(args.image, 1920, 1080) if not args.image else read_image(args.image)
        rows = bench_model(args.model, frame, args.repeat, args.threads)
    except YoloedgeError as exc:
        return _complain(exc)
    print(format_table(f"{redact_value(args.model)}: whole pipeline vs bare runtime ({args.repeat} runs)", rows))
    return 0

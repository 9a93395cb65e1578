"""`yoloedge detect`: run a model on image files and print the detections.

One JSON line per image with --json (for scripts and the parity tooling), a table otherwise.
A missing, undecodable or oversized image (see `yoloedge.sources.imagesize`) is reported and
skipped; the exit code is then 2. A model that cannot be loaded stops the command at once with
exit code 2. Labels and file names are shown with control characters escaped (`textsafe`).

An argument may be a camera URL pasted by mistake (`rtsp://admin:pw@cam/s`, or `admin:pw@cam/s`
without its scheme): its secrets are registered before anything is read, and every message and
record shows inputs in their display form (`yoloedge.redact`), never the password.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Iterator, TextIO

import numpy as np

from ..config import PROVIDERS, AcceleratorConfig, ModelConfig, OnnxRuntimeConfig
from ..config.catalogue import BACKEND_NAMES, CATALOGUE
from ..errors import ImageError, YoloedgeError
from ..postprocess import FORMATS
from ..redact import SECRETS, redact_text, redact_value
from ..sources.imagesize import read_image
from ..textsafe import printable

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2", ".pgm", ".ppm"}


def add_parser(sub) -> None:
    p = sub.add_parser("detect", help="detect objects in image files",
                       description="Run a YOLO model on images and print the detections "
                                   "(boxes in source-image pixels).")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files or folders of images")
    p.add_argument("-m", "--model", required=True,
                   help="model file: ONNX, or what --backend runs (.om for ascend, .engine for tensorrt)")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="onnxruntime",
                   help="runtime that runs the model (default onnxruntime): "
                        + "; ".join(f"{e.name}: {e.summary}" for e in CATALOGUE.values()))
    p.add_argument("--format", choices=FORMATS, help="output layout (default: recognised from the model)")
    p.add_argument("--conf", type=float, default=0.25, help="minimum score (default 0.25)")
    p.add_argument("--iou", type=float, default=0.45, help="NMS IoU threshold (default 0.45)")
    p.add_argument("--max-det", type=int, default=300, help="most detections per image (default 300)")
    nms = p.add_mutually_exclusive_group()
    nms.add_argument("--agnostic-nms", dest="agnostic_nms", action="store_true", default=None,
                     help="suppress overlapping boxes across classes (default for YOLOX)")
    nms.add_argument("--class-nms", dest="agnostic_nms", action="store_false",
                     help="suppress only within a class (default except YOLOX)")
    p.add_argument("--labels", help="labels file (one per line, or YAML with 'names')")
    p.add_argument("--classes", help="comma-separated labels or ids to keep")
    p.add_argument("--imgsz", type=int, nargs="+", metavar="N",
                   help="input size for models with dynamic input axes: N or H W")
    p.add_argument("--letterbox", choices=("center", "topleft"), help="override image placement")
    p.add_argument("--provider", choices=tuple(PROVIDERS), default="cpu",
                   help="ONNX Runtime execution provider (default cpu)")
    p.add_argument("--device-id", type=int, default=0, help="accelerator index for the backend or provider")
    p.add_argument("--batch", type=int, default=1, help="frames per inference for dynamic-batch models")
    p.add_argument("--json", action="store_true", help="one JSON object per image and line")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    from ..pipeline.detector import open_detector

    for arg in (*args.images, args.model, args.labels):
        if arg:
            SECRETS.add_url(arg)  # before any message: one may quote the argument in any form
    if not 0 <= args.conf <= 1 or not 0 <= args.iou <= 1:
        print("yoloedge detect: --conf and --iou must lie between 0 and 1", file=err)
        return 2
    if args.backend != "onnxruntime" and args.provider != "cpu":
        print(f"yoloedge detect: --provider applies only to --backend onnxruntime, not {args.backend}", file=err)
        return 2
    if args.batch < 1 or args.max_det < 1:
        print("yoloedge detect: --batch and --max-det must be at least 1", file=err)
        return 2
    imgsz = None
    if args.imgsz:
        imgsz = (args.imgsz[0], args.imgsz[-1]) if len(args.imgsz) <= 2 else None
        if imgsz is None:
            print("yoloedge detect: --imgsz takes N or H W", file=err)
            return 2
    config = ModelConfig(
        path=args.model, format=args.format, labels=args.labels, conf=args.conf, iou=args.iou,
        max_det=args.max_det, agnostic_nms=args.agnostic_nms, letterbox=args.letterbox, imgsz=imgsz,
        classes=[c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None)
    try:
        detector = open_detector(config, args.backend, backend_settings(args), max_batch=args.batch)
    except YoloedgeError as exc:
        print(printable(redact_text(f"yoloedge detect: {exc}"), keep_newlines=True), file=err)
        return 2
    failed = 0
    try:
        for batch in _batches(_images(args.images, err), detector.max_batch):
            good = [(name, img) for name, img in batch if img is not None]
            failed += len(batch) - len(good)
            if not good:
                continue
            results = detector.detect([img for _, img in good])
            for (name, _), dets in zip(good, results):
                record = {"image": redact_value(name), "width": dets.width, "height": dets.height,
                          "detections": dets.to_dicts(detector.labels)}
                out.write(json.dumps(record) + "\n" if args.json else _table(record))
                out.flush()
    finally:
        detector.close()
    return 2 if failed else 0


def backend_settings(args: argparse.Namespace) -> object:
    """The settings object `--backend` takes for device `--device-id`: its catalogue defaults, with
    `--provider` for ONNX Runtime."""
    accelerator = AcceleratorConfig(backend=args.backend,
                                    onnxruntime=OnnxRuntimeConfig(provider=args.provider))
    return CATALOGUE[args.backend].device_config(accelerator, args.device_id)


def _images(paths: list[str], err: TextIO) -> Iterator[tuple[str, np.ndarray | None]]:
    """Yield (name, image); image is None (after a message on stderr) when it cannot be read."""
    for arg in paths:
        p = Path(arg)
        if p.is_dir():
            files = sorted(f for f in p.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                _complain(f"no images in folder {arg}", err)
                yield arg, None
            for f in files:
                yield from _read(str(f), err)
        else:
            yield from _read(arg, err)


def _read(name: str, err: TextIO) -> Iterator[tuple[str, np.ndarray | None]]:
    try:
        img = read_image(name)
    except ImageError as exc:
        _complain(str(exc), err)
        yield name, None
        return
    yield name, img


def _complain(message: str, err: TextIO) -> None:
    """A message about an input: no secret of a registered argument, no control character."""
    print(printable(redact_text(f"yoloedge detect: {message}")), file=err)


def _batches(items, size):
    batch = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _table(record: dict) -> str:
    lines = [f"{record['image']}  ({record['width']}x{record['height']}): "
             f"{len(record['detections'])} detection(s)"]
    if record["detections"]:
        lines.append(f"  {'label':<16} {'id':>3} {'score':>6}   {'x1':>7} {'y1':>7} {'x2':>7} {'y2':>7}")
        for d in record["detections"]:
            x1, y1, x2, y2 = d["box"]
            lines.append(f"  {d['label']:<16} {d['class_id']:>3} {d['score']:>6.3f}   "
                         f"{x1:>7.1f} {y1:>7.1f} {x2:>7.1f} {y2:>7.1f}")
    return "\n".join(printable(line) for line in lines) + "\n"

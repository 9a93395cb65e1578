"""`yoloedge verify`: does the configured accelerator detect what the source ONNX detects?

Runs the same frames through the config's first accelerator (exactly as the daemon would load it)
and through ONNX Runtime on the CPU with the source ONNX model, and applies the agreement rule of
`yoloedge.verify` per frame. Meant for the step between converting a model (ATC, trtexec) and
deploying it: a wrong AIPP block or colour order gives plausible boxes with the wrong scores, which
nothing else catches.

Exit codes: 0 every frame agrees, 1 some disagree, 2 an input problem (images, source model, a model
that does not load), 78 a configuration error.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from typing import TextIO

from ..config.errors import EX_CONFIG, ConfigError
from ..config.loader import DEFAULT_PATH, load_config
from ..config.model import ModelConfig, OnnxRuntimeConfig
from ..config.schema import Config
from ..errors import YoloedgeError
from ..redact import redact_value
from ..verify import Frames, Report, camera_inputs, read_inputs, run_both, style_notes

EXIT_AGREE = 0
EXIT_DISAGREE = 1
EXIT_INPUT = 2
DEFAULT_FRAMES = 5


class InputProblem(Exception):
    """Something the user must fix on the command line or in the files it names (exit 2)."""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "verify", help="compare the configured accelerator with the source ONNX model",
        description="Run reference frames through the configured accelerator and through ONNX Runtime "
                    "(CPU) on the source ONNX, and report per frame whether the detections agree "
                    "(same class, IoU >= 0.90, score within 0.02). Exits 0 when all agree, 1 when any "
                    f"disagrees, 2 on input errors, {EX_CONFIG} on configuration errors.")
    p.add_argument("-c", "--config", default=DEFAULT_PATH, help=f"configuration file (default {DEFAULT_PATH})")
    p.add_argument("--onnx", metavar="SOURCE.onnx",
                   help="the ONNX the accelerator's model was converted from (default: the accelerator "
                        "section's source_onnx, or model.path itself for an ONNX model)")
    p.add_argument("--images", nargs="+", metavar="IMG_OR_DIR",
                   help="images, folders of images or video files (default: the first frames of the "
                        "config's file and folder cameras)")
    p.add_argument("--frames", type=int, default=DEFAULT_FRAMES,
                   help=f"frames taken from each video file or camera (default {DEFAULT_FRAMES})")
    p.add_argument("--source-color", choices=("rgb", "bgr"),
                   help="channel order the source ONNX was trained on (default: its family's)")
    p.add_argument("--source-letterbox", choices=("center", "topleft"),
                   help="letterbox placement the source ONNX was trained with (default: its family's)")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--source-normalize", dest="source_normalize", action="store_true", default=None,
                      help="the source ONNX takes pixels / 255 (default: its family's)")
    norm.add_argument("--no-source-normalize", dest="source_normalize", action="store_false",
                      help="the source ONNX takes 0-255 pixels")
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        config = load_config(args.config, os.environ)
    except ConfigError as exc:
        print(str(exc), file=err)
        return EX_CONFIG
    try:
        source = source_onnx(config, args.onnx)
        frames = gather_frames(config, args)
        report = verify(config, source, frames, args)
    except InputProblem as exc:
        print(f"yoloedge verify: {exc}", file=err)
        return EXIT_INPUT
    for line in frames.skipped:
        print(f"yoloedge verify: skipped camera {line}", file=err)
    out.write(report.to_json() + "\n" if args.json else report.to_text())
    return EXIT_AGREE if report.agree else EXIT_DISAGREE


def source_onnx(config: Config, given: str | None) -> str:
    """The reference model: --onnx, else the accelerator section's `source_onnx` (relative to the
    config file), else the configured model itself when it is an ONNX file."""
    if given:
        if not os.path.isfile(given):
            raise InputProblem(f"source ONNX not found: {redact_value(given)}")
        return given
    acc = config.accelerators[0]
    configured = acc.options.get("source_onnx")
    if configured:
        path = os.path.join(os.path.dirname(os.path.abspath(config.source)), str(configured))
        if not os.path.isfile(path):
            raise InputProblem(f"{config.source}: accelerator {acc.name}: source_onnx not found: {path}")
        return path
    if config.model.path.lower().endswith(".onnx"):
        return config.model.path
    raise InputProblem(f"no source ONNX for {config.model.path}: pass --onnx MODEL.onnx (the file it was "
                       f"converted from), or set source_onnx in the {acc.backend} section of the accelerator")


def gather_frames(config: Config, args: argparse.Namespace) -> Frames:
    if args.frames < 1:
        raise InputProblem("--frames must be at least 1")
    if args.images:
        frames = read_inputs(args.images, args.frames)
    else:
        frames = camera_inputs(config.cameras, args.frames)
        if not frames.frames and not frames.problems:
            skipped = f"; skipped: {'; '.join(frames.skipped)}" if frames.skipped else ""
            raise InputProblem("no frames to verify on: pass --images IMG_OR_DIR (the config has no file "
                               f"or folder camera to take frames from{skipped})")
    if frames.problems:
        raise InputProblem("cannot read every input (verifying on a partial set would mislead):\n  "
                           + "\n  ".join(frames.problems))
    if not frames.frames:
        raise InputProblem("no frames to verify on")
    return frames


def reference_model(model: ModelConfig, source: str, args: argparse.Namespace) -> ModelConfig:
    """The config's model settings on the source ONNX, run the way its family was trained.

    Thresholds, classes and layout are the config's so both sides filter alike; the config's
    pre-processing overrides (color, letterbox, normalize) are deliberately not copied: they are
    what is being checked.
    """
    return replace(model, path=source, input="host", color=args.source_color,
                   letterbox=args.source_letterbox, normalize=args.source_normalize)


def verify(config: Config, source: str, frames: Frames, args: argparse.Namespace) -> Report:
    from ..backends import backend_config_for, create_backend
    from ..pipeline.detector import Detector, open_detector

    acc = config.accelerators[0]
    accelerator = reference = None
    try:
        try:
            backend = create_backend(acc.backend, config.model.path, backend_config_for(acc, acc.devices[0]))
        except YoloedgeError as exc:
            raise InputProblem(f"accelerator {acc.name} ({acc.backend}): {exc}") from exc
        try:
            accelerator = Detector(config.model, backend, max_batch=acc.batch)
        except YoloedgeError as exc:
            backend.close()
            raise InputProblem(f"accelerator {acc.name} ({acc.backend}) cannot load "
                               f"{config.model.path}: {exc}") from exc
        try:
            reference = open_detector(reference_model(config.model, source, args), "onnxruntime",
                                      OnnxRuntimeConfig(provider="cpu"), max_batch=1, warm_up=False)
        except YoloedgeError as exc:
            raise InputProblem(f"cannot load the source ONNX {source}: {exc}") from exc
        report = Report(
            accelerator={"name": acc.name, "backend": acc.backend, "device": acc.devices[0],
                         "model": config.model.path, "description": accelerator.backend.description,
                         "batch": accelerator.max_batch},
            reference={"model": source, "description": reference.backend.description},
            notes=style_notes(accelerator.style, reference.style, host_normalises=not accelerator.input.nhwc))
        try:
            report.results = run_both(accelerator, reference, frames.frames)
        except YoloedgeError as exc:
            raise InputProblem(f"inference failed: {exc}") from exc
        return report
    finally:
        for detector in (accelerator, reference):
            if detector is not None:
                detector.close()

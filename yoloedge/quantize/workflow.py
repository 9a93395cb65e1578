"""The whole `yoloedge quantize` run: frames, calibration, quantization, agreement, speed.

Both models are opened through the project's `Detector` on ONNX Runtime with the same session
options, so the report compares what the daemon would run: the same letterbox, decoder,
thresholds and NMS. Speed is the model's run alone (letterbox and decoding excluded, they are the
same for both), timed alternately float/INT8 on the same tensors after a few warm-up runs, so a
change in the machine's load touches both.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..config import CameraConfig, ModelConfig, OnnxRuntimeConfig
from .agreement import Agreement, Boxes, agreement
from .calibrate import (QuantizeError, TensorReader, amct_input, letterboxed, quantize, require_onnx,
                        tensor_ranges, tensorrt_table)
from .cameras import CameraSample, Warn, sample_cameras
from .frames import Frame, MediaError, read_frames, require_frames, source_length, split, spread

log = logging.getLogger(__name__)

WARM_UP_RUNS = 3
#: the INT8 model's boxes for the AP are taken down to this score (the usual mAP practice: the
#: curve needs the low-scored boxes); precision and recall count those at `conf` only
AP_CONF = 0.001


@dataclass(frozen=True)
class Options:
    model: str
    output: str
    #: a folder or video to calibrate on; None: the `cameras` instead
    calibrate: str | None
    evaluate: str | None = None
    frames: int = 32  # calibration frames
    eval_frames: int = 20
    format: str | None = None
    conf: float = 0.25
    iou: float = 0.45
    method: str = "minmax"
    per_channel: bool = True
    threads: int = 0
    timing_runs: int = 20
    tensorrt_table: str | None = None
    amct: str | None = None
    #: the configured cameras to calibrate on (when `calibrate` is None), and their config file
    cameras: tuple[CameraConfig, ...] = ()
    cameras_config: str | None = None
    #: a live camera's frames are this far apart (files and folders: spread over their length)
    interval_s: float = 1.0


@dataclass
class Report:
    model: str
    output: str
    calibration_source: str
    calibration_frames: int
    eval_source: str
    eval_frames: int
    #: "held-out frames of the calibration source" or "a separate source"
    eval_kind: str
    precision: float
    recall: float
    map50: float
    float_boxes: int
    int8_boxes: int
    matched_boxes: int
    float_fps: float
    int8_fps: float
    speedup: float
    timing_runs: int
    method: str
    #: AP per class label (the classes the float model found); mAP is their mean
    ap_per_class: dict[str, float]
    ap_definition: str = "VOC all-point interpolation, IoU 0.5, the float model's boxes as truth"
    tensorrt_table: str | None = None
    tensorrt_tensors: int | None = None
    amct_dir: str | None = None
    amct_command: str | None = None
    #: with --cameras: the frames each camera gave, {name: {"calibration_frames": n, "eval_frames": m}},
    #: and the cameras skipped, {name: why}
    cameras: dict[str, dict[str, int]] | None = None
    skipped_cameras: dict[str, str] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def _open(path: str, options: Options, conf: float | None = None):
    from ..pipeline.detector import open_detector

    config = ModelConfig(path=path, format=options.format, conf=options.conf if conf is None else conf,
                         iou=options.iou)
    detector = open_detector(config, "onnxruntime", OnnxRuntimeConfig(intra_op_threads=options.threads))
    if detector.input.nhwc or detector.spec.input.dtype != np.float32:
        detector.close()
        raise QuantizeError(f"{path}: the quantizer takes a float32 NCHW model; this one wants "
                            f"{detector.spec.input.dtype} {'NHWC' if detector.input.nhwc else 'NCHW'}")
    return detector


HELD_OUT = "held-out frames of the calibration source"
SEPARATE = "a separate source"


@dataclass(frozen=True)
class Frames:
    calibration: list[Frame]
    held_out: list[Frame]
    calibration_source: str
    eval_source: str
    eval_kind: str
    cameras: CameraSample | None = None


def _frames(options: Options, warn: Warn) -> Frames:
    if options.calibrate is None:
        return _camera_frames(options, warn)
    calib, held, eval_source, eval_kind = _path_frames(options, options.calibrate)
    return Frames(calib, held, options.calibrate, eval_source, eval_kind)


def _camera_frames(options: Options, warn: Warn) -> Frames:
    """The cameras' frames: calibration, and the held-out ones too unless --eval names a source."""
    evaluate = options.evaluate
    sample = sample_cameras(options.cameras, options.frames, 0 if evaluate is not None else options.eval_frames,
                            options.interval_s, warn)
    if not sample.calibration:
        why = "; ".join(f"{name}: {problem}" for name, problem in sample.skipped().items())
        raise MediaError(f"no camera gave a frame to calibrate on ({why or 'none was read'})")
    source = (f"camera{'s' if len(sample.used()) > 1 else ''} "
              f"{', '.join(c.name for c in sample.used())} (config {options.cameras_config})")
    if evaluate is not None:
        held = read_frames(evaluate, spread(source_length(evaluate), options.eval_frames))
        return Frames(sample.calibration, require_frames(evaluate, held, "evaluate"), source, evaluate,
                      SEPARATE, sample)
    if not sample.held_out:
        raise QuantizeError(f"{source}: no frame is left for the report after {len(sample.calibration)} "
                            f"calibration frames: pass --eval PATH, fewer --frames, or more cameras")
    return Frames(sample.calibration, sample.held_out, source, source, HELD_OUT, sample)


def _path_frames(options: Options, calibrate: str) -> tuple[list[Frame], list[Frame], str, str]:
    """(calibration frames, held-out frames, the held-out source, what kind it is)."""
    total = source_length(calibrate)
    evaluate = options.evaluate
    if evaluate is None or Path(evaluate).resolve() == Path(calibrate).resolve():
        parts = split(total, options.frames, options.eval_frames)  # never report on the frames calibration saw
        calib = require_frames(calibrate, read_frames(calibrate, parts.calibration), "calibrate")
        held = read_frames(calibrate, parts.held_out)
        if not held:
            raise QuantizeError(f"{calibrate}: no frame is left for the report after {len(calib)} "
                                f"calibration frames: pass --eval PATH or fewer --frames")
        return calib, held, calibrate, HELD_OUT
    calib = require_frames(calibrate, read_frames(calibrate, spread(total, options.frames)), "calibrate")
    held = read_frames(evaluate, spread(source_length(evaluate), options.eval_frames))
    return calib, require_frames(evaluate, held, "evaluate"), evaluate, SEPARATE


def _boxes(detector, frames: list[Frame]) -> list[Boxes]:
    return [Boxes.of(d.boxes, d.scores, d.class_ids) for d in detector.detect([f.image for f in frames])]


def _time_both(float_det, int8_det, tensors: list[np.ndarray], runs: int) -> tuple[float, float]:
    """Frames/s of each model's run alone, alternating on the same tensors after a warm-up."""
    spent = [0.0, 0.0]
    detectors = (float_det, int8_det)
    for det in detectors:
        for _ in range(WARM_UP_RUNS):
            det.backend.input_buffer[:1] = tensors[0]
            det.infer(1)
    for i in range(runs):
        tensor = tensors[i % len(tensors)]
        for k, det in enumerate(detectors):
            det.backend.input_buffer[:1] = tensor
            start = time.perf_counter()
            det.infer(1)
            spent[k] += time.perf_counter() - start
    return runs / spent[0], runs / spent[1]


def _log_warning(message: str) -> None:
    log.warning("%s", message)


def run(options: Options, warn: Warn = _log_warning) -> Report:
    """The whole run; `warn` is told of each camera skipped (with --cameras) as it happens."""
    require_onnx()
    if not Path(options.model).is_file():
        raise QuantizeError(f"{options.model}: no such model file")
    try:
        Path(options.output).resolve().parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise QuantizeError(f"cannot create the folder of {options.output}: {exc}") from exc
    float_det = _open(options.model, options)
    try:
        frames = _frames(options, warn)
        calib, held = frames.calibration, frames.held_out
        tensors = letterboxed(float_det, calib)
        reader = TensorReader(float_det.spec.input.name, tensors)
        log.info("calibrating on %d frames of %s", len(tensors), frames.calibration_source)
        quantize(options.model, options.output, reader, options.method, options.per_channel)
        report_extra = _side_outputs(options, reader, tensors)
        int8_det = _open(options.output, options, conf=min(options.conf, AP_CONF))
        try:
            result: Agreement = agreement(_boxes(int8_det, held), _boxes(float_det, held), conf=options.conf)
            labels = float_det.labels
            per_class = {labels[c] if 0 <= c < len(labels) else str(c): ap for c, ap in result.ap_per_class.items()}
            fps_float, fps_int8 = _time_both(float_det, int8_det, letterboxed(float_det, held),
                                             max(options.timing_runs, 1))
        finally:
            int8_det.close()
    finally:
        float_det.close()
    return Report(
        model=options.model, output=options.output, calibration_source=frames.calibration_source,
        calibration_frames=len(calib), eval_source=frames.eval_source, eval_frames=len(held),
        eval_kind=frames.eval_kind,
        precision=result.precision, recall=result.recall, map50=result.map50,
        float_boxes=result.truths, int8_boxes=result.predictions, matched_boxes=result.true_positives,
        float_fps=fps_float, int8_fps=fps_int8, speedup=fps_int8 / fps_float,
        timing_runs=max(options.timing_runs, 1), method=options.method, ap_per_class=per_class,
        **_camera_counts(frames.cameras), **report_extra)


def _camera_counts(sample: CameraSample | None) -> dict:
    """The report's `cameras` and `skipped_cameras`, with --cameras."""
    if sample is None:
        return {}
    return {"cameras": {c.name: {"calibration_frames": len(c.calibration), "eval_frames": len(c.held_out)}
                        for c in sample.used()},
            "skipped_cameras": sample.skipped()}


def _side_outputs(options: Options, reader: TensorReader, tensors: list[np.ndarray]) -> dict:
    """The TensorRT table and the AMCT input, when asked for."""
    extra: dict = {}
    if options.tensorrt_table:
        ranges = tensor_ranges(options.model, reader, options.method)
        try:
            Path(options.tensorrt_table).write_text(tensorrt_table(ranges))
        except OSError as exc:
            raise QuantizeError(f"cannot write the TensorRT table {options.tensorrt_table}: {exc}") from exc
        extra.update(tensorrt_table=options.tensorrt_table, tensorrt_tensors=len(ranges))
    if options.amct:
        try:
            amct = amct_input(options.model, reader.input_name, tensors, options.amct)
        except OSError as exc:
            raise QuantizeError(f"cannot write AMCT's calibration input into {options.amct}: {exc}") from exc
        extra.update(amct_dir=str(amct.folder), amct_command=amct.command)
    return extra


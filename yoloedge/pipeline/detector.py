"""Frames in, detections out: one model on one backend, with the shared pre/post-processing.

The three stages are separate methods so the daemon can run them on different threads
(pre-processing on preparer threads, execution on the device worker, post-processing on its own
threads); `detect` chains them for the CLI and the tests.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..backends.base import Backend
from ..config.model import ModelConfig
from ..errors import ModelError
from ..model.labels import COCO80, placeholder_labels, resolve_labels
from ..model.spec import ModelSpec, channels_last
from ..postprocess import Detections, Layout, PostprocessSettings, Postprocessor, detect_layout, make_decoder
from ..preprocess import Geometry, Letterboxer, family_style

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputFormat:
    height: int
    width: int
    channels: int
    nhwc: bool


class Detector:
    """Owns a backend opened for `max_batch` frames and turns batches of frames into detections.

    `input_sets` / `output_sets` are the buffers the backend allocates for a pipeline that fills
    one batch while another runs; `detect` itself uses set 0 of each."""

    def __init__(self, config: ModelConfig, backend: Backend, max_batch: int = 1,
                 input_sets: int = 1, output_sets: int = 1):
        self.config = config
        self.backend = backend
        self.spec: ModelSpec = backend.open(max_batch, input_hw=config.imgsz, input_sets=input_sets,
                                            output_sets=output_sets)
        self.input = _input_format(self.spec, config)
        configured = resolve_labels(config.labels, self.spec.metadata.names)
        self.layout: Layout = detect_layout(
            self.spec.outputs, (self.input.height, self.input.width), self.spec.metadata,
            num_classes=len(configured) if configured else None,
            format=config.format, anchors=config.anchors)
        self.labels = configured or _default_labels(self.layout.num_classes)
        self.style = family_style(self.layout.format, config.letterbox, config.color, config.normalize)
        agnostic = config.agnostic_nms if config.agnostic_nms is not None else self.layout.format == "yolox"
        self.settings = PostprocessSettings(
            conf=config.conf, iou=config.iou, max_det=config.max_det, agnostic_nms=agnostic,
            classes=self._class_ids(config.classes),
            class_conf={self._class_id(k): float(v) for k, v in config.class_conf.items()})
        self.letterbox = self.new_letterboxer()
        self.postprocess_one = Postprocessor(make_decoder(self.layout), self.settings)
        log.info("model %s: format %s, %d classes, input %dx%d, %s", config.path, self.layout.format,
                 len(self.labels), self.input.width, self.input.height, backend.description)

    def new_letterboxer(self) -> Letterboxer:
        """A letterboxer for this model's input, with buffers of its own (one per thread)."""
        return Letterboxer(self.input.height, self.input.width, self.input.channels,
                           nhwc=self.input.nhwc, style=self.style)

    @property
    def max_batch(self) -> int:
        return self.backend.max_batch

    def warm_up(self) -> None:
        """Run blank frames so lazy initialisation happens before we report ready: one batch of
        each size in `Backend.warm_up_batches` (one frame, or one per gear of a dynamic-batch .om).
        An input the card fills itself (`Backend.device_inputs`) runs on what its memory holds."""
        sizes = self.backend.warm_up_batches
        if self.backend.device_inputs is not None:
            for n in sizes:
                self.backend.run(n)
            return
        blank = np.full((self.input.height, self.input.width, 3), 114, np.uint8)
        for n in sizes:
            self.detect([blank] * n)

    def preprocess(self, frames: Sequence[np.ndarray]) -> list[Geometry]:
        """Letterbox up to `max_batch` frames into the backend's input buffer, slot by slot."""
        if len(frames) > self.max_batch:
            raise ValueError(f"{len(frames)} frames exceed the batch of {self.max_batch}")
        buf = self.backend.input_buffer
        return [self.letterbox(frame, buf[i]) for i, frame in enumerate(frames)]

    def infer(self, n: int) -> list[np.ndarray]:
        return self.backend.run(n)

    def postprocess(self, outputs: Sequence[np.ndarray], geometries: Sequence[Geometry]) -> list[Detections]:
        return [self.postprocess_one([o[i] for o in outputs], g) for i, g in enumerate(geometries)]

    def detect(self, frames: Sequence[np.ndarray]) -> list[Detections]:
        results: list[Detections] = []
        for start in range(0, len(frames), self.max_batch):
            chunk = frames[start:start + self.max_batch]
            geometries = self.preprocess(chunk)
            results.extend(self.postprocess(self.infer(len(chunk)), geometries))
        return results

    def close(self) -> None:
        self.backend.close()

    # -- class filters ---------------------------------------------------------------------
    def _class_ids(self, classes) -> frozenset[int] | None:
        return None if classes is None else frozenset(self._class_id(c) for c in classes)

    def _class_id(self, value: str | int) -> int:
        if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
            cid = int(value)
            if not 0 <= cid < max(len(self.labels), 1):
                raise ModelError(f"class id {cid} is out of range: the model has {len(self.labels)} classes")
            return cid
        if value in self.labels:
            return self.labels.index(value)
        close = difflib.get_close_matches(str(value), self.labels, n=3)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ModelError(f"unknown class {value!r}: not among the model's {len(self.labels)} labels{hint}")


def _input_format(spec: ModelSpec, config: ModelConfig) -> InputFormat:
    shape = spec.input.shape
    dtype = spec.input.dtype
    nhwc = config.input == "aipp" or channels_last(shape)
    if nhwc:
        _, h, w, c = shape
        if dtype != np.uint8:
            raise ModelError(f"{spec.path}: an NHWC (AIPP) input must be uint8, the model wants {dtype}")
    else:
        _, c, h, w = shape
        if dtype not in (np.float32, np.float16):
            raise ModelError(f"{spec.path}: NCHW input must be float32 or float16, the model wants {dtype}")
    return InputFormat(h, w, c, nhwc)


def _default_labels(num_classes: int) -> list[str]:
    if num_classes in (0, len(COCO80)):
        return list(COCO80)
    log.warning("no labels for a %d-class model: using class0..class%d (set model.labels)",
                num_classes, num_classes - 1)
    return placeholder_labels(num_classes)


def open_detector(config: ModelConfig, backend: str = "onnxruntime", backend_config=None,
                  max_batch: int = 1, warm_up: bool = True) -> Detector:
    """Create the backend, load the model and (by default) warm it up."""
    from ..backends import create_backend

    detector = Detector(config, create_backend(backend, config.path, backend_config), max_batch)
    if warm_up:
        detector.warm_up()
    return detector

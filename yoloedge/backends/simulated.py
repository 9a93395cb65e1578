"""A simulated accelerator: real model outputs at a chosen device speed, with no device.

For capacity planning (`backend: simulated`), dry runs of a configuration on a box without its
card, and `yoloedge bench pipeline`, which must show whether the host can keep a fast card busy.

At `open` the real model is loaded once with ONNX Runtime on the CPU, only to learn its tensors
and metadata and to record what it outputs for one image (letterboxed the way its family expects);
the session is then closed. From then on `run(n)` waits `base + per_frame * n` milliseconds --
sleeping, so the GIL is free for the rest of the pipeline, as it is during a real device call --
and returns views of output sets that hold the recorded outputs in every slot. Decode and NMS
downstream therefore do exactly the work they would do for that image.

`input: aipp` presents a uint8 NHWC input like an Ascend `.om` converted with AIPP, so the host
path of such a deployment (uint8 letterbox, no normalisation) can be measured too.
"""

from __future__ import annotations

import logging
import time

import cv2
import numpy as np

from ..config.model import OnnxRuntimeConfig
from ..config.simulated import SimulatedConfig
from ..errors import BackendError, ImageError
from ..model.spec import DYNAMIC, ModelSpec, TensorSpec, channels_last, image_hwc
from ..postprocess import detect_layout
from ..preprocess import Letterboxer, family_style
from .base import Backend, check_open_request, host_buffer
from .onnxruntime import OnnxRuntimeBackend

log = logging.getLogger(__name__)

GREY = 114


class SimulatedBackend(Backend):
    name = "simulated"

    def __init__(self, model_path: str, config: SimulatedConfig | None = None,
                 sleep=time.sleep, clock=time.perf_counter):
        self.model_path = str(model_path)
        self.config = config or SimulatedConfig()
        self._sleep = sleep
        self._clock = clock
        self._spec: ModelSpec | None = None
        self._inputs: list[np.ndarray] = []
        self._output_sets: list[list[np.ndarray]] = []
        self._capacity = 0
        self.runs = 0

    def open(self, max_batch: int = 1, input_hw: tuple[int, int] | None = None, *,
             input_sets: int = 1, output_sets: int = 1) -> ModelSpec:
        if self._spec is not None:
            return self._spec
        check_open_request(max_batch, input_sets, output_sets)
        model = OnnxRuntimeBackend(self.model_path, OnnxRuntimeConfig())
        try:
            spec = model.open(1, input_hw)
            recorded = self._record(model, spec)
        finally:
            model.close()
        inp = spec.input
        shape = inp.shape[1:]
        dtype = inp.dtype
        if self.config.input == "aipp":
            h, w, _ = image_hwc(inp.shape)
            shape, dtype = (h, w, 3), np.dtype(np.uint8)
        self._capacity = max_batch
        self._inputs = [host_buffer((max_batch, *shape), dtype) for _ in range(input_sets)]
        self._output_sets = [[np.broadcast_to(r, (max_batch, *r.shape)).copy() for r in recorded]
                             for _ in range(output_sets)]
        self._spec = ModelSpec(
            self.model_path, (TensorSpec(inp.name, (max_batch, *shape), dtype),),
            tuple(TensorSpec(o.name, (DYNAMIC, *o.per_item_shape()), o.dtype) for o in spec.outputs),
            spec.metadata)
        log.info("simulated device %d: %s, %.1f ms + %.1f ms per frame, outputs recorded on %s",
                 self.config.device_id, self.model_path, *self.config.device_ms,
                 self.config.image or "a grey frame")
        return self._spec

    def _record(self, model: OnnxRuntimeBackend, spec: ModelSpec) -> list[np.ndarray]:
        """The model's real outputs for one image, letterboxed the way its family expects."""
        h, w, channels = image_hwc(spec.input.shape)
        nhwc = channels_last(spec.input.shape)
        names = spec.metadata.names
        layout = detect_layout(spec.outputs, (h, w), spec.metadata, num_classes=len(names) if names else None)
        if self.config.image:
            image = cv2.imread(self.config.image, cv2.IMREAD_COLOR)
            if image is None:
                raise ImageError(f"simulated device: cannot read image {self.config.image}")
        else:
            image = np.full((h, w, 3), GREY, np.uint8)
        letterbox = Letterboxer(h, w, channels, nhwc=nhwc, style=family_style(layout.format))
        letterbox(image, model.input_buffer[0])
        return [o[0].copy() for o in model.run(1)]

    @property
    def input_buffers(self) -> list[np.ndarray]:
        if self._spec is None:
            raise BackendError("backend is not open")
        return self._inputs

    @property
    def max_batch(self) -> int:
        return self._capacity

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(range(1, self._capacity + 1))

    @property
    def description(self) -> str:
        base, per_frame = self.config.device_ms
        return (f"simulated device {self.config.device_id} ({base:g} ms + {per_frame:g} ms/frame, "
                f"{self.config.input} input)")

    def run(self, n: int, input_set: int = 0, output_set: int = 0) -> list[np.ndarray]:
        if self._spec is None:
            raise BackendError("backend is not open")
        if not 1 <= n <= self._capacity:
            raise BackendError(f"batch of {n} outside 1..{self._capacity}")
        if not 0 <= input_set < len(self._inputs) or not 0 <= output_set < len(self._output_sets):
            raise BackendError(f"input set {input_set} / output set {output_set} out of range")
        base, per_frame = self.config.device_ms
        deadline = self._clock() + (base + per_frame * n) / 1000.0
        while (left := deadline - self._clock()) > 0:
            self._sleep(left)
        self.runs += 1
        return [o[:n] for o in self._output_sets[output_set]]

    def close(self) -> None:
        self._spec = None
        self._inputs = []
        self._output_sets = []


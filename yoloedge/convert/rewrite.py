"""ONNX -> ONNX rewrites before a vendor conversion (onnxslim simplification, FP16), each checked.

A rewritten graph is only used after it gave the same boxes as the original on real images through
ONNX Runtime on the CPU: a simplifier can fold a shape wrongly, and FP16 can overflow (a Sigmoid's
logits past 65504, a Softmax sum) or lose small scores. The check runs both models through the
project's own `Detector` (letterbox, decoder, NMS), so it compares what the daemon would publish,
and also reports the largest absolute difference of the raw outputs.

FP16 uses ONNX Runtime's own `onnxruntime.transformers.float16.convert_float_to_float16` (it ships
with onnxruntime; it needs the `onnx` package). `keep_io_types=True` leaves the inputs and outputs
float32, with Casts inside, so the host side does not change; `--fp16-io` makes them float16 too.

The default agreement rule is `yoloedge verify`'s (class equal, IoU >= 0.90, scores within 0.02 for
every detection scoring >= 0.30 on either side). Why it fits FP16: float16 keeps 11 significant bits
(relative rounding 4.9e-4 per value). Measured on YOLOX-nano (the converting-models page has the
figures), the raw outputs move by up to 0.38 (raw box terms in grid units, before the stride), the
published boxes by under half a pixel (IoU > 0.99) and the scores by under 0.002: ten times inside
0.02 / IoU 0.9. A disagreement beyond that is not rounding but a broken graph (an overflow past
65504, a wrong Cast), which is what the check is for.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..runtime import module_installed
from ..verify import MAX_SCORE_DIFF, MIN_IOU, Tolerance, compare_detections
from .source import ConvertError

SLIM_HINT = "the graph simplifier is not installed: pip install 'yoloedge[slim]' (or: pip install onnxslim)"
ONNX_HINT = "the onnx package is needed to rewrite a model: pip install onnx"


@dataclass
class Agreement:
    """How a rewritten model's results compare with the original's on the same images."""

    images: int = 0
    max_abs_diff: float = 0.0  # over every raw output value of every image
    reference_boxes: int = 0
    matched: int = 0
    problems: list[str] = field(default_factory=list)  # one line per disagreement, with the image

    @property
    def agree(self) -> bool:
        return self.images > 0 and not self.problems

    def line(self) -> str:
        return (f"{self.matched}/{self.reference_boxes} boxes agree on {self.images} image"
                f"{'s' if self.images != 1 else ''}; max abs diff of raw outputs {self.max_abs_diff:.4g}")


def _need_onnx():
    if not module_installed("onnx"):
        raise ConvertError(ONNX_HINT)
    import onnx

    return onnx


def node_count(path: str) -> int:
    onnx = _need_onnx()
    return len(onnx.load(path, load_external_data=False).graph.node)


def simplify(src: str, dst: str) -> tuple[int, int]:
    """Write the onnxslim-simplified `src` to `dst`; (nodes before, nodes after)."""
    if not module_installed("onnxslim"):
        raise ConvertError(SLIM_HINT)
    onnx = _need_onnx()
    import onnxslim

    model = onnx.load(src)
    before = len(model.graph.node)
    try:
        slim = onnxslim.slim(model)
    except Exception as exc:  # onnxslim raises whatever its passes raise; one message for all
        raise ConvertError(f"onnxslim could not simplify {src}: {str(exc).splitlines()[0] if str(exc) else exc!r}") \
            from exc
    onnx.save(slim, dst)
    return before, len(slim.graph.node)


def to_fp16(src: str, dst: str, fp16_io: bool = False) -> None:
    """Write the FP16 version of the float model `src` to `dst`."""
    onnx = _need_onnx()
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(src)
    kinds = {i.type.tensor_type.elem_type for i in model.graph.input}
    if onnx.TensorProto.FLOAT not in kinds:
        raise ConvertError(f"{src} has no float32 input (already FP16 or quantised?): `convert fp16` "
                           "takes a float32 model")
    half = convert_float_to_float16(model, keep_io_types=not fp16_io)
    topological_order(half.graph)  # the converter appends the input Casts last; parsers want them first
    onnx.save(half, dst)


def topological_order(graph) -> None:
    """Reorder `graph.node` so every node comes after the producers of its inputs (ONNX requires it;
    `convert_float_to_float16(keep_io_types=True)` appends the Casts of the graph inputs at the end,
    which ONNX Runtime accepts but the ONNX checker, and converters parsing in order, do not).
    Nodes left unresolved (outer-scope names of subgraphs) keep their order at the end."""
    ready = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    pending = list(graph.node)
    ordered = []
    while pending:
        still = []
        for node in pending:  # one pass places every node whose producers came before it
            if all(i in ready for i in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                still.append(node)
        if len(still) == len(pending):
            ordered += still
            break
        pending = still
    copies = [type(n)() for n in ordered]
    for copy, node in zip(copies, ordered):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def compare(reference: str, candidate: str, frames: Sequence[tuple[str, np.ndarray]], model_format: str | None = None,
            max_score_diff: float = MAX_SCORE_DIFF, min_iou: float = MIN_IOU) -> Agreement:
    """Run both models on `frames` (ORT, CPU) and compare raw outputs and boxes."""
    from ..config import ModelConfig
    from ..pipeline.detector import open_detector

    if not frames:
        raise ConvertError("no images to check the rewritten model on")
    ref = open_detector(ModelConfig(path=reference, format=model_format), warm_up=False)
    cand = open_detector(ModelConfig(path=candidate, format=model_format), warm_up=False)
    tolerance = Tolerance(max_score_diff=max_score_diff, min_iou=min_iou)
    result = Agreement()
    try:
        for name, frame in frames:
            ref_out, ref_det = _run(ref, frame)
            cand_out, cand_det = _run(cand, frame)
            for a, b in zip(ref_out, cand_out):
                result.max_abs_diff = max(result.max_abs_diff, float(np.max(np.abs(a - b))))
            ours, theirs = cand_det.to_dicts(cand.labels, 3), ref_det.to_dicts(ref.labels, 3)
            verdict = compare_detections(ours, theirs, tolerance)
            result.images += 1
            result.reference_boxes += len(verdict.matched) + len(verdict.missing)
            result.matched += len(verdict.matched)
            result.problems += [f"{os.path.basename(name)}: {p}" for p in verdict.problems()]
    finally:
        ref.close()
        cand.close()
    return result


def _run(detector, frame: np.ndarray):
    geometries = detector.preprocess([frame])
    outputs = [np.asarray(o, dtype=np.float32).copy() for o in detector.infer(1)]
    return outputs, detector.postprocess(outputs, geometries)[0]

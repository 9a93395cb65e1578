"""Backend-neutral description of a model's tensors and metadata.

Every backend (ONNX Runtime, Ascend `.om`, TensorRT engine) fills one `ModelSpec`, so the shared
pre- and post-processing never needs to know which runtime produced it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from .labels import labels_from_names

#: The dimension value used for an axis whose size is only known at run time.
DYNAMIC = -1


def channels_last(shape: Sequence[int]) -> bool:
    """A 4-D image input is NHWC when its last axis looks like channels (1 or 3) and its second
    does not; everything else is read as NCHW."""
    return shape[3] in (1, 3) and shape[1] not in (1, 3)


def image_hwc(shape: Sequence[int]) -> tuple[int, int, int]:
    """(height, width, channels) of a 4-D image input shape, NHWC or NCHW."""
    if channels_last(shape):
        return shape[1], shape[2], shape[3]
    return shape[2], shape[3], shape[1]


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # DYNAMIC (-1) where the model leaves an axis open
    dtype: np.dtype

    @property
    def batch_is_dynamic(self) -> bool:
        return bool(self.shape) and self.shape[0] == DYNAMIC

    def per_item_shape(self) -> tuple[int, ...]:
        """Shape of one batch item (the leading batch axis dropped)."""
        return tuple(self.shape[1:])


@dataclass(frozen=True)
class ModelMetadata:
    """The parts of Ultralytics' ONNX metadata that change how a model is driven."""

    names: list[str] | None = None
    imgsz: tuple[int, int] | None = None  # (h, w)
    stride: int | None = None
    end2end: bool | None = None
    task: str | None = None
    channels: int | None = None
    raw: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_ultralytics(self) -> bool:
        return "task" in self.raw or "imgsz" in self.raw or "author" in self.raw


@dataclass(frozen=True)
class ModelSpec:
    path: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    metadata: ModelMetadata

    @property
    def input(self) -> TensorSpec:
        return self.inputs[0]


def parse_metadata(raw: Mapping[str, str]) -> ModelMetadata:
    """Read Ultralytics metadata; values are Python literals stored as strings."""
    names = labels_from_names(_literal(raw.get("names"))) or None
    imgsz_val = _literal(raw.get("imgsz"))
    imgsz = None
    if isinstance(imgsz_val, int):
        imgsz = (imgsz_val, imgsz_val)
    elif isinstance(imgsz_val, (list, tuple)) and len(imgsz_val) == 2:
        imgsz = (int(imgsz_val[0]), int(imgsz_val[1]))
    stride = _literal(raw.get("stride"))
    if isinstance(stride, (list, tuple)) and stride:
        stride = max(stride)
    end2end = _literal(raw.get("end2end"))
    channels = _literal(raw.get("channels"))
    return ModelMetadata(
        names=names,
        imgsz=imgsz,
        stride=int(stride) if isinstance(stride, (int, float)) else None,
        end2end=bool(end2end) if isinstance(end2end, bool) else None,
        task=raw.get("task"),
        channels=int(channels) if isinstance(channels, int) else None,
        raw=dict(raw),
    )


def _literal(text: str | None) -> object:
    if text is None:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def normalise_shape(dims: Sequence[object]) -> tuple[int, ...]:
    """Turn runtime shape entries (ints, None, 'batch', -1) into ints with DYNAMIC for open axes."""
    out = []
    for d in dims:
        out.append(int(d) if isinstance(d, (int, np.integer)) and int(d) > 0 else DYNAMIC)
    return tuple(out)

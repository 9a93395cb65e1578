"""Backend-neutral description of a model's tensors and metadata.

Every backend (ONNX Runtime, Ascend `.om`, TensorRT engine) fills one `ModelSpec`, so the shared
pre- and post-processing never needs to know which runtime produced it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import ModelError
from .labels import labels_from_names

#: The dimension value used for an axis whose size is only known at run time.
DYNAMIC = -1
#: bounds for metadata numbers: a value past them is a corrupt or hostile file, not a model (an
#: 8192x8192 float input already needs 800 MB per frame).
MAX_IMGSZ = 8192
MAX_STRIDE = 1024
MAX_CHANNELS = 4
#: metadata values longer than this are not parsed (Ultralytics' COCO names take about 1 KB).
MAX_METADATA_CHARS = 1_000_000


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


def parse_metadata(raw: Mapping[str, str], source: str = "the model") -> ModelMetadata:
    """Read Ultralytics metadata; values are Python literals stored as strings.

    The values decide buffer sizes and label lists, so each one we use must be what it claims; a
    bad one raises ModelError naming `source` (the model file) and the key, like any broken model.
    Keys we do not use are kept in `raw` unread.
    """
    reader = _MetadataReader(raw, source)
    return ModelMetadata(
        names=reader.names(),
        imgsz=reader.imgsz(),
        stride=reader.stride(),
        end2end=reader.boolean("end2end"),
        task=reader.text("task"),
        channels=reader.whole("channels", 1, MAX_CHANNELS),
        raw=dict(raw),
    )


class _MetadataReader:
    """One method per kind of value; each returns None for an absent key."""

    def __init__(self, raw: Mapping[str, str], source: str):
        self.raw = raw
        self.source = source

    def fail(self, key: str, requirement: str) -> ModelError:
        shown = repr(self.raw[key])
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return ModelError(f"{self.source}: bad model metadata {key} = {shown}: {requirement} "
                          f"(re-export the model, or fix its metadata)")

    def literal(self, key: str, requirement: str) -> object:
        text = self.raw.get(key)
        if text is None:
            return None
        if not isinstance(text, str) or len(text) > MAX_METADATA_CHARS:
            raise self.fail(key, requirement)
        try:
            return ast.literal_eval(text)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise self.fail(key, requirement) from None

    def names(self) -> list[str] | None:
        requirement = "must be a list of names or an {index: name} mapping"
        value = self.literal("names", requirement)
        if value is None:
            return None
        if not isinstance(value, (list, tuple, dict)):
            raise self.fail("names", requirement)
        try:
            return labels_from_names(value) or None
        except ValueError as exc:
            raise self.fail("names", str(exc)) from None

    def imgsz(self) -> tuple[int, int] | None:
        requirement = f"must be N or [H, W], whole numbers from 1 to {MAX_IMGSZ}"
        value = self.literal("imgsz", requirement)
        if value is None:
            return None
        sides = [_whole(side, 1, MAX_IMGSZ) for side in (value if isinstance(value, (list, tuple)) else [value] * 2)]
        if len(sides) != 2 or sides[0] is None or sides[1] is None:
            raise self.fail("imgsz", requirement)
        return (sides[0], sides[1])

    def stride(self) -> int | None:
        """One stride or one per head (the largest counts)."""
        requirement = f"must be a whole number from 1 to {MAX_STRIDE}, or a list of them"
        value = self.literal("stride", requirement)
        if value is None:
            return None
        strides = [_whole(s, 1, MAX_STRIDE) for s in (value if isinstance(value, (list, tuple)) else [value])]
        whole = [s for s in strides if s is not None]
        if not strides or len(whole) != len(strides):
            raise self.fail("stride", requirement)
        return max(whole)

    def whole(self, key: str, low: int, high: int) -> int | None:
        requirement = f"must be a whole number from {low} to {high}"
        value = self.literal(key, requirement)
        if value is None:
            return None
        whole = _whole(value, low, high)
        if whole is None:
            raise self.fail(key, requirement)
        return whole

    def boolean(self, key: str) -> bool | None:
        value = self.literal(key, "must be True or False")
        if value is not None and not isinstance(value, bool):
            raise self.fail(key, "must be True or False")
        return value

    def text(self, key: str) -> str | None:
        value = self.raw.get(key)
        if value is not None and (not isinstance(value, str) or not value.isprintable() or len(value) > 100):
            raise self.fail(key, "must be a short printable name, e.g. detect")
        return value


def _whole(value: object, low: int, high: int) -> int | None:
    """The value as an int when it is one from `low` to `high`, else None. Ultralytics writes 640
    or 640.0; True, NaN, infinity and 1e999 are not sizes."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not value.is_integer():  # NaN and infinity are not integers
        return None
    return int(value) if low <= value <= high else None


def normalise_shape(dims: Sequence[object]) -> tuple[int, ...]:
    """Turn runtime shape entries (ints, None, 'batch', -1) into ints with DYNAMIC for open axes."""
    out = []
    for d in dims:
        out.append(int(d) if isinstance(d, (int, np.integer)) and int(d) > 0 else DYNAMIC)
    return tuple(out)

"""Class labels: from model metadata, a labels file, a list in config, or COCO-80."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..errors import ModelError
from ..files import FileProblem, read_bounded

#: most classes a model or labels file may name; an index past it is a corrupt file, and a dense
#: label list that long would only waste memory.
MAX_CLASSES = 100_000
#: the largest labels file read: 100,000 labels of ten characters. The config check refuses a larger
#: file too (a 2 GB sparse file would otherwise pass `check` and kill the daemon with MemoryError).
MAX_LABELS_BYTES = 1024 * 1024

COCO80: tuple[str, ...] = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich",
    "orange", "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch",
    "potted plant", "bed", "dining table", "toilet", "tv", "laptop", "mouse", "remote",
    "keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator", "book",
    "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)


def read_labels_file(path: str | Path) -> list[str]:
    """One label per line (blank lines and '#' comments ignored), as Darknet/YOLO tools write them.

    A YAML file with a `names:` list or mapping (an Ultralytics data file) is accepted too, so the
    file a model was trained with can be pointed at directly.
    """
    p = Path(path)
    try:
        text = read_bounded(str(p), MAX_LABELS_BYTES).decode("utf-8")
    except FileProblem as exc:
        raise ModelError(f"cannot read labels file {p}: {exc.reason}") from None
    except UnicodeDecodeError as exc:
        raise ModelError(f"labels file {p} is not UTF-8 text (byte {exc.start})") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        return _labels_from_yaml(p, text)
    labels = [line.strip() for line in text.splitlines()]
    labels = [line for line in labels if line and not line.startswith("#")]
    if not labels:
        raise ModelError(f"labels file {p} holds no labels")
    return labels


def _labels_from_yaml(path: Path, text: str) -> list[str]:
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ModelError(f"labels file {path} is not valid YAML: {exc}") from exc
    names = data.get("names") if isinstance(data, dict) else data
    try:
        labels = labels_from_names(names)
    except ValueError as exc:
        raise ModelError(f"labels file {path}: names: {exc}") from None
    if not labels:
        raise ModelError(f"labels file {path}: expected a 'names' list or mapping")
    return labels


def labels_from_names(names: object) -> list[str]:
    """Turn a `names` list or an {index: name} mapping into a dense list ordered by index; [] when
    `names` is neither. A mapping whose keys are not class indexes from 0 to MAX_CLASSES - 1, or
    more than MAX_CLASSES names, raise ValueError saying so."""
    if isinstance(names, (list, tuple)):
        if len(names) > MAX_CLASSES:
            raise ValueError(f"{len(names)} names; at most {MAX_CLASSES} classes are supported")
        return [str(n) for n in names]
    if isinstance(names, dict) and names:
        indexed = {_class_index(key): str(value) for key, value in names.items()}
        return [indexed.get(i, f"class{i}") for i in range(max(indexed) + 1)]
    return []


def _class_index(key: object) -> int:
    """0 or "0" (a YAML file may quote its keys)."""
    text = key.strip() if isinstance(key, str) else None
    index = int(text) if text and text.isdecimal() and len(text) <= 6 else key
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < MAX_CLASSES:
        raise ValueError(f"key {str(key)[:40]!r} is not a class index from 0 to {MAX_CLASSES - 1}")
    return index


def placeholder_labels(count: int) -> list[str]:
    return [f"class{i}" for i in range(count)]


def resolve_labels(
    configured: str | Sequence[str] | None,
    metadata_names: Sequence[str] | None,
) -> list[str] | None:
    """Pick labels by precedence: explicit config (file or list), then model metadata.

    Returns None when neither is given; the caller falls back to COCO-80 or placeholders once
    the class count is known from the output shape.
    """
    if isinstance(configured, (str, Path)):
        return read_labels_file(configured)
    if configured is not None:
        labels = [str(x) for x in configured]
        if not labels:
            raise ModelError("the configured labels list is empty")
        return labels
    if metadata_names:
        return list(metadata_names)
    return None

"""The `model:` and `models:` keys: which models the daemon runs.

A config gives one `model:` (a mapping) or `models:` (a list of them, each with a `name`), never both
(`take_models`). A single `model:` is the one model, named after its file's stem
(`config.model.stem_name`) unless it has a `name`, so files written before `models:` existed load
unchanged. Names are read like camera names: they are what `accelerators[].models` and
`cameras[].models` name (`config.modelrefs`), the `"model"` field of every detections message and
the `model` label of status and `/metrics`. The dataclass of a model is `config.model.ModelConfig`.
"""

from __future__ import annotations

from typing import Any

from ..model.labels import MAX_CLASSES, MAX_LABELS_BYTES
from .fields import (INVALID, MAX_NAME_BYTES, MAX_TEXT_BYTES, Boolean, Choice, Context, FilePath, Integer, Key, Number,
                     Text, is_number, is_whole, mapping_or_report, read_fields, read_string_list,
                     sequence_or_report, show, topic_safe)
from .model import FORMATS, ModelConfig, stem_name
from .yamltree import Item

#: the most detections kept per frame, and the largest model input side (8192: MAX_IMAGE_PIXELS).
MAX_DETECTIONS = 100_000
MAX_IMGSZ = 8192
#: the most models of one config: each is loaded on every device of its group (an Atlas 300V's
#: 24 GB holds many small ones, but not hundreds), and every frame of a camera goes to each of its.
MAX_MODELS = 64

#: the two forms of the models' section: `model:` (one mapping) and `models:` (a list).
ONE_MODEL_KEY = "model"
MODELS_KEY = "models"
BOTH_FORMS_HINT = ("keep models: and move the model: mapping into it as one more entry (- name: ..., path: ...), "
                   "or keep model: alone for a single model")
NO_MODEL_HINT = "e.g. model: {path: /var/lib/yoloedge/models/yolov8n.onnx}, or models: [{name: coco, path: ...}]"


# -- one model ---------------------------------------------------------------------------------

def read_model(ctx: Context, item: Item) -> Any:
    """`model:`: one model; a ModelConfig or INVALID."""
    values = read_fields(ctx, item, MODEL_FIELDS, required=("path",))
    if values is None or "path" not in values:
        return INVALID
    if "name" not in values and "name" not in item.value and not _stem_name_ok(ctx, item.value["path"], values["path"]):
        return INVALID
    return ModelConfig(**values)


def _stem_name_ok(ctx: Context, path_item: Item, path: str) -> bool:
    """A model without `name:` is named after its file; a stem that cannot be a name (too long,
    an unprintable character) asks for one."""
    name = stem_name(path)
    if topic_safe(name) and len(name.encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES:
        return True
    ctx.problem(path_item, f"the model would be named after its file, but the file's stem {show(name)} cannot be a "
                           f"name (at most {MAX_NAME_BYTES} bytes, printable, no '/', '+', '#' or spaces)",
                "give the model a name: (e.g. name: coco)")
    return False


def read_labels(ctx: Context, item: Item) -> Any:
    """A labels file, or the labels themselves as a list."""
    if item.value is None or isinstance(item.value, str):
        return FilePath(optional=True, max_bytes=MAX_LABELS_BYTES)(ctx, item)
    names = read_string_list(ctx, item, "label names", MAX_CLASSES)
    return INVALID if names is INVALID else tuple(names)


def read_model_classes(ctx: Context, item: Item) -> Any:
    """Labels or class ids to keep; an empty list would keep nothing, which is never meant."""
    if item.value is None:
        return None
    children = sequence_or_report(ctx, item, "labels or class ids", MAX_CLASSES)
    if children is None:
        return INVALID
    if not children:
        return ctx.bad_value(item, "must not be empty (leave it out to keep every class)")
    keys = [child.value if is_class_key(child.value) else ctx.bad_value(child, f"must be {CLASS_KEY}")
            for child in children]
    return INVALID if INVALID in keys else tuple(keys)


CLASS_KEY = f"a label or a class id from 0 to {MAX_CLASSES - 1}"


def is_class_key(value: Any) -> bool:
    """A label ("person") or a class id (0): how classes are named in `classes` and `class_conf`."""
    return ((isinstance(value, str) and bool(value.strip()) and len(value) <= MAX_TEXT_BYTES)
            or (is_whole(value) and 0 <= value < MAX_CLASSES))


def read_class_conf(ctx: Context, item: Item) -> Any:
    entries = mapping_or_report(ctx, item, optional=True)
    if entries is None:
        return {} if item.value is None else INVALID
    result = {}
    for key, child in entries.items():
        if not is_class_key(key):
            result[key] = ctx.problem(child, f"{show(key)} is not {CLASS_KEY}")
        else:
            result[key] = Number(ge=0, le=1, example=0.5)(ctx, child)
    return INVALID if INVALID in result.values() else result


def read_imgsz(ctx: Context, item: Item) -> Any:
    """N (square) or [H, W]: the input size for models whose input axes are dynamic."""
    value = item.value
    requirement = f"must be N or [H, W] (whole numbers from 1 to {MAX_IMGSZ}) or null"
    if value is None:
        return None
    if _side(value):
        return (value, value)
    if item.is_sequence and len(value) == 2 and all(_side(c.value) for c in value):
        return (value[0].value, value[1].value)
    return ctx.bad_value(item, requirement, "e.g. imgsz: 640 or imgsz: [384, 640]")


def _side(value: Any) -> bool:
    return is_whole(value) and 1 <= value <= MAX_IMGSZ


def read_anchors(ctx: Context, item: Item) -> Any:
    """Raw-head anchors: one list of w,h pairs per head, flat or as [w, h] pairs."""
    if item.value is None:
        return None
    levels = sequence_or_report(ctx, item, "anchor lists, one per head")
    if levels is None:
        return INVALID
    if not levels:
        return ctx.bad_value(item, "must not be empty (leave it out for the YOLOv5 defaults)")
    parsed = [_anchor_level(ctx, level) for level in levels]
    return INVALID if INVALID in parsed else tuple(parsed)


def _anchor_level(ctx: Context, item: Item) -> Any:
    flat = _flattened(item) if item.is_sequence else []
    if not flat or len(flat) % 2 or not all(is_number(v) and 0 < v <= MAX_IMGSZ for v in flat):
        return ctx.bad_value(item, f"must be a list of w,h pairs (numbers > 0 and <= {MAX_IMGSZ})",
                             "e.g. [10,13, 16,30, 33,23] or [[10,13], [16,30], [33,23]]")
    return tuple(float(v) for v in flat)


def _flattened(item: Item) -> list[Any]:
    """[10, 13, 16, 30] and [[10, 13], [16, 30]] both give [10, 13, 16, 30]."""
    flat: list[Any] = []
    for child in item.value:
        if child.is_sequence:
            flat.extend(grandchild.value for grandchild in child.value)
        else:
            flat.append(child.value)
    return flat


# -- several models ----------------------------------------------------------------------------

def read_models(ctx: Context, item: Item) -> Any:
    """`models:`: a non-empty list of models with unique names; a tuple of ModelConfigs or INVALID."""
    children = sequence_or_report(ctx, item, "models", MAX_MODELS)
    if children is None:
        return INVALID
    if not children:
        return ctx.bad_value(item, "must list at least one model", "e.g. models: [{name: coco, path: yolo11n.onnx}]")
    models = [read_model(ctx, child) for child in children]
    _report_duplicate_model_names(ctx, children)
    names = [model.name for model in models if model is not INVALID]
    if INVALID in models or len(set(names)) != len(names):
        return INVALID
    return tuple(models)


def declared_name(item: Item) -> str | None:
    """The name an entry of `models:` (or the `model:` mapping) gives itself as written: its
    `name`, else its file's stem; None when neither can be read. Read from the Item, so references
    to a model whose other keys are wrong are not reported as unknown as well."""
    if not item.is_mapping:
        return None
    name = item.value.get("name")
    if name is not None:
        return name.value if isinstance(name.value, str) and name.value else None
    path = item.value.get("path")
    return stem_name(path.value) if path is not None and isinstance(path.value, str) else None


def _report_duplicate_model_names(ctx: Context, children: list[Item]) -> None:
    """One model per name; the second of two is reported, at its `name` (or its entry)."""
    first: dict[str, Item] = {}
    for child in children:
        name = declared_name(child)
        if name is None:
            continue
        if name not in first:
            first[name] = child
            continue
        earlier = first[name]
        named = "name" in child.value and "name" in earlier.value
        hint = ("give each model its own name:" if named
                else "a model without name: is named after its file's stem; give one of them a name:")
        ctx.problem(child.value.get("name", child), f"duplicate model name {name!r} (first used at line "
                                                    f"{earlier.value.get('name', earlier).line}); names must be "
                                                    f"unique", hint)


def declared_names(root: Item) -> tuple[str, ...] | None:
    """The model names the file declares, in order (from the Items: `declared_name`); None when
    the models' section is missing, given twice or not a mapping / a list, so that no reference is
    judged against a list that is not the file's."""
    entries = root.value
    if (ONE_MODEL_KEY in entries) == (MODELS_KEY in entries):
        return None
    if ONE_MODEL_KEY in entries:
        children = [entries[ONE_MODEL_KEY]]
    elif entries[MODELS_KEY].is_sequence:
        children = entries[MODELS_KEY].value
    else:
        return None
    names = [declared_name(child) for child in children]
    known = [name for name in names if name is not None]
    return tuple(dict.fromkeys(known)) if len(known) == len(names) else None


def take_models(ctx: Context, root: Item, values: dict) -> tuple[ModelConfig, ...] | None:
    """The models of the file, removed from `values` (the top level's, as `read_fields` read
    them): exactly one of `model:` and `models:` must be given. None when they cannot be used
    (every problem is reported)."""
    one = values.pop(ONE_MODEL_KEY, None)
    several = values.pop(MODELS_KEY, None)
    entries = root.value
    if ONE_MODEL_KEY in entries and MODELS_KEY in entries:
        second = max(entries[ONE_MODEL_KEY], entries[MODELS_KEY], key=lambda entry: entry.line)
        first = entries[ONE_MODEL_KEY] if second is entries[MODELS_KEY] else entries[MODELS_KEY]
        ctx.problem(second, f"model: and models: are both given ({key_of(first)}: at line {first.line}); a config "
                            f"gives one model (model:) or a list of named models (models:)", BOTH_FORMS_HINT)
        return None
    if ONE_MODEL_KEY not in entries and MODELS_KEY not in entries:
        ctx.problem(root, "required key is missing: a config needs model: (one model) or models: (a list of named "
                          "models)", NO_MODEL_HINT, path=ONE_MODEL_KEY)
        return None
    if one is not None:
        return (one,)
    return several


def key_of(item: Item) -> str:
    return item.path.rsplit(".", 1)[-1]


def path_key(root: Item, index: int) -> str:
    """The key path of model `index`'s file as messages name it: `model.path` or `models[1].path`."""
    return f"{ONE_MODEL_KEY}.path" if ONE_MODEL_KEY in root.value else f"{MODELS_KEY}[{index}].path"


def labels_key(root: Item, index: int) -> str:
    return path_key(root, index).removesuffix(".path") + ".labels"


MODEL_FIELDS: dict[str, Key] = {
    "name": Key(Text(topic_safe=True, max_bytes=MAX_NAME_BYTES),
                "what `accelerators[].models` and `cameras[].models` refer to; the detections' `\"model\"` field, "
                "the `model` label of status and `/metrics`",
                default="the file's stem (`/` `+` `#` and spaces as `_`); unique"),
    "path": Key(FilePath(),
                "ONNX model (`.om` / `.engine` for Ascend / TensorRT)",
                default="required, must be a regular file"),
    "format": Key(Choice(FORMATS, optional=True),
                  "output layout; null recognises it"),
    "labels": Key(read_labels,
                  "labels file (one per line, or YAML with `names:`) or the labels; null: model metadata, else "
                  "COCO-80 / `class0..N`",
                  type=f"path (a regular file <= {MAX_LABELS_BYTES // 1024 // 1024} MiB), list of strings, or null"),
    "conf": Key(Number(ge=0, le=1, example=0.25),
                "minimum score"),
    "iou": Key(Number(ge=0, le=1, example=0.45),
               "NMS overlap threshold"),
    "max_det": Key(Integer(ge=1, le=MAX_DETECTIONS, example=300),
                   "most detections per frame"),
    "agnostic_nms": Key(Boolean(optional=True),
                        "NMS across classes; null: YOLOX yes, others no"),
    "classes": Key(read_model_classes,
                   "keep only these classes",
                   type="non-empty list of labels / ids, or null"),
    "class_conf": Key(read_class_conf,
                      "per-class minimum score",
                      type="mapping label/id -> number 0..1"),
    "imgsz": Key(read_imgsz,
                 "input size for dynamic-axis models",
                 type=f"N, [H, W] (1..{MAX_IMGSZ}), or null"),
    "anchors": Key(read_anchors,
                   "raw-head anchors, one list per head; null: YOLOv5's",
                   type="list of w,h lists, or null"),
    "input": Key(Choice(("host", "aipp")),
                 "float NCHW on the host, or uint8 NHWC (Ascend AIPP)"),
    "letterbox": Key(Choice(("center", "topleft"), optional=True),
                     "placement; null: family default"),
    "color": Key(Choice(("rgb", "bgr"), optional=True),
                 "channel order; null: family default"),
    "normalize": Key(Boolean(optional=True),
                     "divide by 255; null: family default"),
}

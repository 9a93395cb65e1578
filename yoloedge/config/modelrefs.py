"""`accelerators[].models` and `cameras[].models`: which group loads which model, and which camera's
frames go to which.

A group loads every model unless its `models:` names some; a camera goes to every model its group
loads unless its `models:` names some, which must be among those. The names are read here
(`ModelNames`) and judged once the models and accelerators are read (`check_model_references`),
on the Items, so a camera or an accelerator with other problems is still checked and every line is
reported; a name is judged against the names the file declares (`config.models.declared_names`),
so a model with a bad key is not called unknown as well. The same resolution at run time is
`Config.group_models` and `Config.camera_models`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import ModelError
from ..model.labels import read_labels_file
from .fields import INVALID, MAX_NAME_BYTES, Context, Text, did_you_mean, sequence_or_report
from .model import ModelConfig
from .models import MAX_MODELS, declared_names, labels_key
from .schema import AcceleratorConfig
from .yamltree import Item
from .zones import check_camera_objects


@dataclass(frozen=True)
class ModelNames:
    """`models:` of an accelerator or a camera: model names, each once; null is the default."""

    default: str  # what leaving it out means, for the message about an empty list

    def __call__(self, ctx: Context, item: Item) -> Any:
        if item.value is None:
            return None
        children = sequence_or_report(ctx, item, "model names", MAX_MODELS)
        if children is None:
            return INVALID
        if not children:
            return ctx.bad_value(item, f"must not be empty (leave it out for {self.default})")
        names = [Text(topic_safe=True, max_bytes=MAX_NAME_BYTES)(ctx, child) for child in children]
        if INVALID in names:
            return INVALID
        seen: dict[str, int] = {}
        for child, name in zip(children, names):
            if name in seen:
                return ctx.bad_value(child, f"is listed twice (first at line {seen[name]}); name each model once")
            seen[name] = child.line
        return tuple(names)

    def describe(self) -> str:
        return "non-empty list of model names (each once), or null"


def check_model_references(ctx: Context, root: Item, accelerators: tuple[AcceleratorConfig, ...] | None) -> None:
    """Every name in `accelerators[].models` and `cameras[].models` is a model of the file, and a
    camera's are loaded by its group. `accelerators`: the groups as read, or None when they are not
    valid (then only unknown names are reported)."""
    names = declared_names(root)
    if names is None:
        return
    for item in _list(root, "accelerators"):
        _check_known(ctx, item, names)
    groups = {a.name: (a, i) for i, a in enumerate(accelerators)} if accelerators else {}
    for camera in _list(root, "cameras"):
        known = _check_known(ctx, camera, names)
        group = _group_of(camera, accelerators)
        if group is None:
            continue
        accelerator, index = groups[group]
        loads = [name for name in names if accelerator.models is None or name in accelerator.models]
        for child in known:
            if child.value not in loads:
                ctx.bad_value(child, f"is not loaded by this camera's accelerator {group} (its models: "
                                     f"{', '.join(loads)})",
                              f"add {child.value} to that accelerator's models: (accelerators[{index}].models), or "
                              f"run this camera on an accelerator that loads it")


def check_camera_decoders(ctx: Context, root: Item, accelerators: tuple[AcceleratorConfig, ...] | None) -> None:
    """`decoder: dvpp` is the Atlas card's media engine: the camera's group must be `backend:
    ascend` (its pictures are decoded on the card that runs them)."""
    for camera in _list(root, "cameras"):
        decoder = camera.value.get("decoder")
        if decoder is None or decoder.value != "dvpp":
            continue
        group = _group_of(camera, accelerators)
        if group is None or accelerators is None:
            continue
        accelerator = next(a for a in accelerators if a.name == group)
        if accelerator.backend != "ascend":
            ctx.bad_value(decoder, f"decodes on an Atlas card's DVPP, but this camera's accelerator {group} is "
                                   f"backend: {accelerator.backend}",
                          "run this camera on an accelerator with backend: ascend, or use decoder: auto")


def _list(root: Item, key: str) -> list[Item]:
    item = root.value.get(key)
    return [child for child in item.value if child.is_mapping] if item is not None and item.is_sequence else []


def _check_known(ctx: Context, entry: Item, names: Sequence[str]) -> list[Item]:
    """Report the names of `entry`'s `models:` that name no model; returns the Items of the others."""
    refs = entry.value.get("models")
    known = []
    for child in refs.value if refs is not None and refs.is_sequence else ():
        if not isinstance(child.value, str):
            continue  # reported by the reader
        if child.value in names:
            known.append(child)
        else:
            ctx.bad_value(child, f"names no model; defined: {', '.join(names)}", did_you_mean(child.value, names))
    return known


def _group_of(camera: Item, accelerators: tuple[AcceleratorConfig, ...] | None) -> str | None:
    """The accelerator a camera (an Item) runs on, or None when that is not known (its reference
    is bad, or the accelerators are not valid)."""
    if not accelerators:
        return None
    ref = camera.value.get("accelerator")
    if ref is None or ref.value is None:
        return accelerators[0].name
    names = [a.name for a in accelerators]
    return ref.value if isinstance(ref.value, str) and ref.value in names else None


def camera_model_names(camera: Item, accelerators: tuple[AcceleratorConfig, ...] | None,
                       names: Sequence[str]) -> tuple[str, ...] | None:
    """The names of the models a camera (an Item) gets, as `Config.camera_models` will resolve
    them; None when a reference is bad or the accelerators are not valid (reported elsewhere)."""
    group = _group_of(camera, accelerators)
    if group is None or accelerators is None:
        return None
    accelerator = next(a for a in accelerators if a.name == group)
    loads = [name for name in names if accelerator.models is None or name in accelerator.models]
    refs = camera.value.get("models")
    if refs is None or refs.value is None:
        return tuple(loads)
    if not refs.is_sequence or any(not isinstance(c.value, str) or c.value not in loads for c in refs.value):
        return None
    wanted = {child.value for child in refs.value}
    return tuple(name for name in loads if name in wanted)


def config_labels(model: ModelConfig) -> Sequence[str] | None:
    """The labels the config gives `model` (a list, or a labels file), or None when only the model
    file knows them (or the file cannot be read: the daemon reports that when it loads the model)."""
    if model.labels is None:
        return None
    if not isinstance(model.labels, str):
        return list(model.labels)
    try:
        return read_labels_file(model.labels)
    except ModelError:
        return None


def check_camera_labels(ctx: Context, root: Item, models: tuple[ModelConfig, ...],
                        groups: tuple[AcceleratorConfig, ...]) -> None:
    """A camera's `classes` and its zones' and lines' `objects` must be labels of the models it
    gets, when the config gives every one of those models' labels."""
    labels = {model.name: config_labels(model) for model in models}
    places = {model.name: labels_key(root, index) for index, model in enumerate(models)}
    names = [model.name for model in models]
    for camera in _list(root, "cameras"):
        gets = camera_model_names(camera, groups, names)
        if not gets or any(labels[name] is None for name in gets):
            continue
        known = list(dict.fromkeys(label for name in gets for label in labels[name] or ()))
        where = (f"the model's labels ({places[gets[0]]})" if len(models) == 1
                 else f"the labels of this camera's models ({', '.join(f'{n}: {places[n]}' for n in gets)})")
        check_camera_objects(ctx, camera.value, known, where)

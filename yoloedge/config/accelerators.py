"""The `accelerators:` list: which backend runs the models on which devices, and its settings.

Which backends exist, which keys hold their settings and how those are validated comes from
`config.catalogue`: ONNX Runtime settings sit directly on the accelerator (`provider: cuda`), other
built-in backends take theirs in a section named after them (`ascend: {...}`, `tensorrt: {...}`), and
custom backends (`backend: package.module:Class`) in `options: {...}`, passed on unvalidated.
"""

from __future__ import annotations

import os
import re
from typing import Any, Sequence

from .catalogue import BACKEND_NAMES, CATALOGUE, PLUGIN_OPTIONS_KEY, owner_of_key
from .fields import (INVALID, MAX_NAME_BYTES, Context, Key, Integer, Number, Text, did_you_mean,
                     mapping_or_report, plain, read_present, report_duplicate_names, report_unknown_keys,
                     sequence_or_report)
from .model import ModelConfig
from .modelrefs import ModelNames
from .schema import AcceleratorConfig, default_name
from .yamltree import Item

#: "package.module:ClassName", a backend class outside yoloedge.
PLUGIN_BACKEND = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
#: bounds no deployment reaches: devices per accelerator (and their indices), frames per batch,
#: how long a partial batch waits, how long one inference may run, failures in a row.
MAX_DEVICES = 64
MAX_DEVICE_INDEX = 1023
MAX_BATCH = 256
MAX_BATCH_TIMEOUT_MS = 60_000
MAX_INFERENCE_TIMEOUT_S = 3600
MAX_ERRORS = 1_000_000


def read_devices(ctx: Context, item: Item) -> Any:
    """Device indices, one worker each; listing one twice would load the model twice on it."""
    children = sequence_or_report(ctx, item, "device indices", MAX_DEVICES)
    if children is None:
        return INVALID
    if not children:
        return ctx.bad_value(item, "must list at least one device index", "e.g. devices: [0]")
    indices = [Integer(ge=0, le=MAX_DEVICE_INDEX)(ctx, child) for child in children]
    if INVALID in indices:
        return INVALID
    if len(set(indices)) != len(indices):
        twice = sorted({i for i in indices if indices.count(i) > 1})
        return ctx.problem(item, f"lists device {', '.join(map(str, twice))} more than once "
                                 f"(each device gets one worker)")
    return tuple(indices)


#: keys every accelerator may have (`backend` is read first: it decides which others apply).
COMMON_FIELDS: dict[str, Key] = {
    "name": Key(Text(topic_safe=True, max_bytes=MAX_NAME_BYTES),
                "referenced by `camera.accelerator`, status, logs",
                default="`<backend><index>`, e.g. `onnxruntime0`"),
    "devices": Key(read_devices,
                   "device indices, one worker each",
                   type=f"1 to {MAX_DEVICES} distinct integers 0..{MAX_DEVICE_INDEX}"),
    "batch": Key(Integer(ge=1, le=MAX_BATCH, example=4),
                 "most frames per inference"),
    "batch_timeout_ms": Key(Number(ge=0, le=MAX_BATCH_TIMEOUT_MS, example=10),
                            "how long a partial batch waits"),
    "inference_timeout_s": Key(Number(gt=0, le=MAX_INFERENCE_TIMEOUT_S, example=10),
                               "longer: the call is abandoned and the device opened again (opening a device is not "
                               "bound by it)"),
    "max_consecutive_errors": Key(Integer(ge=1, le=MAX_ERRORS, example=5),
                                  "failures in a row before the device is opened again"),
    "input_buffers": Key(Integer(ge=2, le=8, example=2),
                         "input buffers (of `batch` frames) per device: the next batch is letterboxed into one "
                         "while the device runs another"),
    "preprocess_threads": Key(Integer(ge=0, le=64, example=2),
                              "threads finishing the letterbox into the input buffers; 0: one per CPU core, at most"
                              " 4"),
    "post_threads": Key(Integer(ge=0, le=64, example=2),
                        "most decode + NMS + publish threads (the pool starts with one and grows while batches "
                        "wait); 0: one per core, at most 4"),
    "models": Key(ModelNames("every model"),
                  "names of the models this group loads, each on every device (see [Several models](#several-models))",
                  default="every model"),
}
#: every key an accelerator may have: the common ones, each backend's settings keys, plugin options.
ALL_KEYS = ("backend", *COMMON_FIELDS, *(key for entry in CATALOGUE.values() for key in entry.settings_keys),
            PLUGIN_OPTIONS_KEY)


def default_accelerators() -> tuple[AcceleratorConfig, ...]:
    """No `accelerators` key: the model runs on the CPU through ONNX Runtime."""
    return (AcceleratorConfig(name=default_name("onnxruntime", 0)),)


def read_accelerators(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return default_accelerators()
    children = sequence_or_report(ctx, item, "accelerators")
    if children is None:
        return INVALID
    if not children:
        return ctx.bad_value(item, "must list at least one accelerator",
                             "leave the key out to run on the CPU with ONNX Runtime")
    accelerators = [read_accelerator(ctx, child, i) for i, child in enumerate(children)]
    names = [a.name if a is not INVALID else None for a in accelerators]
    report_duplicate_names(ctx, children, names, "accelerator")
    return INVALID if INVALID in accelerators else tuple(accelerators)


def read_accelerator(ctx: Context, item: Item, index: int) -> Any:
    entries = mapping_or_report(ctx, item)
    if entries is None:
        return INVALID
    backend = read_backend(ctx, entries["backend"]) if "backend" in entries else "onnxruntime"
    report_unknown_keys(ctx, entries, ALL_KEYS)
    if backend is INVALID:
        return INVALID
    report_keys_of_other_backends(ctx, entries, backend)
    values = read_present(ctx, entries, COMMON_FIELDS)
    entry = CATALOGUE.get(backend)
    if entry is not None:
        values.update(entry.read_settings(ctx, entries))
    else:
        values["options"] = read_plugin_options(ctx, entries.get(PLUGIN_OPTIONS_KEY))
    if INVALID in values.values():
        return INVALID
    values.setdefault("name", default_name(backend, index))
    return AcceleratorConfig(backend=backend, **values)


def read_backend(ctx: Context, item: Item) -> Any:
    value = item.value
    if isinstance(value, str) and (value in CATALOGUE or PLUGIN_BACKEND.fullmatch(value)):
        return value
    hint = did_you_mean(value, BACKEND_NAMES) if isinstance(value, str) else None
    return ctx.bad_value(item, f"must be one of: {', '.join(BACKEND_NAMES)}, "
                               f"or a custom backend as package.module:ClassName", hint)


def report_keys_of_other_backends(ctx: Context, entries: dict, backend: str) -> None:
    """`provider:` on an Ascend accelerator is a misunderstanding worth a precise message."""
    for key, child in entries.items():
        owner = owner_of_key(key)
        if owner is not None and owner.name != backend:
            what = f"the {key} section" if key == owner.name else key
            ctx.problem(child, f"{what} applies only to backend {owner.name} "
                               f"(this accelerator's backend is {backend})")
        elif key == PLUGIN_OPTIONS_KEY and backend in CATALOGUE:
            ctx.problem(child, f"only for custom backends (package.module:Class); "
                               f"{backend} takes its settings in {_settings_place(backend)}")


def _settings_place(backend: str) -> str:
    keys = CATALOGUE[backend].settings_keys
    if keys == (backend,):
        return f"the {backend}: section"
    return f"keys of the accelerator itself ({', '.join(keys[:2])}, ...)"


def read_plugin_options(ctx: Context, item: Item | None) -> Any:
    """A custom backend's `options:`, passed on unvalidated: only its own class knows them."""
    if item is None:
        return {}
    section = mapping_or_report(ctx, item, optional=True)
    if section is None:
        return {} if item.value is None else INVALID
    return {k: plain(v) for k, v in section.items()}


def check_model_file_kind(ctx: Context, items: Item, accelerators: tuple[AcceleratorConfig, ...],
                          models: Sequence[ModelConfig], places: Sequence[str]) -> None:
    """An `.onnx` model on a TensorRT accelerator (or an engine on ONNX Runtime) cannot run: say so at
    `check` rather than when every worker fails. Each group is checked against the models it loads
    (its `models`, else every one); `places[i]`: how messages name model i's file (`model.path`,
    `models[1].path`). Only a suffix that another backend claims is refused; an unusual suffix is
    left to the backend, which reads the file."""
    for accelerator, item in zip(accelerators, items.value if items.is_sequence else ()):
        entry = CATALOGUE.get(accelerator.backend)
        if entry is None:
            continue
        where = item.value.get("backend", item) if item.is_mapping else item
        for model, place in zip(models, places):
            if accelerator.models is not None and model.name not in accelerator.models:
                continue
            suffix = os.path.splitext(model.path)[1].lower()
            others = [e.name for e in CATALOGUE.values() if suffix in e.model_suffixes]
            if not suffix or suffix in entry.model_suffixes or not others:
                continue
            what = place if len(models) == 1 else f"{place} (model {model.name})"
            ctx.problem(where, f"backend {entry.name} runs {'/'.join(entry.model_suffixes)} files, but {what} "
                               f"is a {suffix} file (for {', '.join(others)}); {_conversion_hint(entry.name, place)}")


def _conversion_hint(backend: str, place: str) -> str:
    if backend == "tensorrt":
        return f"build an engine with `yoloedge convert trt` and point {place} at it"
    if backend == "ascend":
        return f"convert the model with `yoloedge convert atc` and point {place} at the .om"
    return f"point {place} at a {'/'.join(CATALOGUE[backend].model_suffixes)} file"


#: the keys that pick an accelerator's backend and hold its own settings: `read_accelerator` reads
#: `backend` first, each backend's catalogue entry its section, `read_plugin_options` `options`.
#: Declared here for the reference (docs/configuration.md), with the common and ONNX Runtime keys.
BACKEND_FIELDS: dict[str, Key] = {
    "backend": Key(read_backend,
                   "runtime; a dotted `module:Class` loads a custom backend; `simulated`: no device, see below",
                   type="`onnxruntime` `ascend` `tensorrt` `simulated` or `package.module:Class`"),
    "ascend": Key(None, "settings of the Ascend backend, see below (only with `backend: ascend`)",
                  type="mapping", default="`{}`"),
    "simulated": Key(None, "settings of the simulated device, see below (only with `backend: simulated`)",
                     type="mapping", default="`{}`"),
    "tensorrt": Key(None, "settings of the TensorRT backend, see below (only with `backend: tensorrt`)",
                    type="mapping", default="`{}`"),
    PLUGIN_OPTIONS_KEY: Key(None, "settings of a custom backend, passed on as they are",
                            type="mapping", default="`{}`"),
}

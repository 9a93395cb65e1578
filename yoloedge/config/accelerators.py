"""The `accelerators:` list: which backend runs the model on which devices, and its settings.

ONNX Runtime settings sit directly on the accelerator (`provider: cuda`); other built-in backends
take theirs in a section named after them (`ascend: {...}`), and custom backends
(`backend: package.module:Class`) in `options: {...}`. The `ascend:` and `simulated:` sections are
validated by `config.ascend` and `config.simulated`; the others are passed on unvalidated until
their backends define schemas.
"""

from __future__ import annotations

import re
from typing import Any

from .ascend import read_ascend_section
from .fields import (INVALID, MAX_NAME_BYTES, Boolean, Choice, Context, Integer, Number, Reader, Text, did_you_mean,
                     mapping_or_report, plain, read_present, report_duplicate_names, report_unknown_keys,
                     sequence_or_report)
from .model import PROVIDERS, OnnxRuntimeConfig
from .schema import BACKENDS, AcceleratorConfig
from .simulated import read_simulated_section
from .yamltree import Item

#: "package.module:ClassName", a backend class outside yoloedge.
PLUGIN_BACKEND = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
GRAPH_OPTIMIZATION = ("disable", "basic", "extended", "all")
#: built-in backends other than ONNX Runtime take their settings in a section named after them.
BACKEND_SECTIONS = tuple(b for b in BACKENDS if b != "onnxruntime")
PLUGIN_OPTIONS_KEY = "options"
#: bounds no deployment reaches: devices per accelerator (and their indices), frames per batch,
#: how long a partial batch waits, how long one inference may run, failures in a row.
MAX_DEVICES = 64
MAX_DEVICE_INDEX = 1023
MAX_BATCH = 256
MAX_BATCH_TIMEOUT_MS = 60_000
MAX_INFERENCE_TIMEOUT_S = 3600
MAX_ERRORS = 1_000_000
#: ONNX Runtime threads per session: each thread has its own arena (100000 took 2.2 GB RSS);
#: a large server CPU has 192 cores, so 256 leaves room.
MAX_INTRA_OP_THREADS = 256


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


def read_provider_options(ctx: Context, item: Item) -> Any:
    """Handed to the execution provider as strings; nested values make no sense there."""
    entries = mapping_or_report(ctx, item, optional=True)
    if entries is None:
        return {} if item.value is None else INVALID
    result = {}
    for key, child in entries.items():
        if child.is_mapping or child.is_sequence or child.value is None:
            ctx.bad_value(child, "must be a string, number or true/false")
            continue
        result[str(key)] = child.value
    return INVALID if len(result) != len(entries) else result


#: keys every accelerator may have (`backend` is read first: it decides which others apply).
COMMON_FIELDS: dict[str, Reader] = {
    "name": Text(topic_safe=True, max_bytes=MAX_NAME_BYTES),
    "devices": read_devices,
    "batch": Integer(ge=1, le=MAX_BATCH, example=4),
    "batch_timeout_ms": Number(ge=0, le=MAX_BATCH_TIMEOUT_MS, example=10),
    "inference_timeout_s": Number(gt=0, le=MAX_INFERENCE_TIMEOUT_S, example=10),
    "max_consecutive_errors": Integer(ge=1, le=MAX_ERRORS, example=5),
    "input_buffers": Integer(ge=2, le=8, example=2),
    "preprocess_threads": Integer(ge=0, le=64, example=2),
    "post_threads": Integer(ge=0, le=64, example=2),
}
ONNXRUNTIME_FIELDS: dict[str, Reader] = {
    "provider": Choice(tuple(PROVIDERS)),
    "provider_options": read_provider_options,
    "allow_fallback": Boolean(),
    "intra_op_threads": Integer(ge=0, le=MAX_INTRA_OP_THREADS, example=4),
    "graph_optimization": Choice(GRAPH_OPTIMIZATION),
    "qdq_fusion": Boolean(),
    "io_binding": Boolean(),
}
ALL_KEYS = ("backend", *COMMON_FIELDS, *ONNXRUNTIME_FIELDS, *BACKEND_SECTIONS, PLUGIN_OPTIONS_KEY)


def default_accelerators() -> tuple[AcceleratorConfig, ...]:
    """No `accelerators` key: the model runs on the CPU through ONNX Runtime."""
    return (AcceleratorConfig(name=default_name("onnxruntime", 0)),)


def default_name(backend: str, index: int) -> str:
    """`onnxruntime0`, `ascend1`, or the lower-cased class name for a plugin (`fpgabackend2`);
    the same rule as the daemon's, so status and camera references agree."""
    return f"{backend.split(':')[-1].lower()}{index}"


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
    if backend == "onnxruntime":
        values["onnxruntime"] = read_onnxruntime(ctx, entries)
    else:
        values["options"] = read_backend_options(ctx, entries, backend)
    if INVALID in values.values():
        return INVALID
    values.setdefault("name", default_name(backend, index))
    return AcceleratorConfig(backend=backend, **values)


def read_backend(ctx: Context, item: Item) -> Any:
    value = item.value
    if isinstance(value, str) and (value in BACKENDS or PLUGIN_BACKEND.fullmatch(value)):
        return value
    hint = did_you_mean(value, BACKENDS) if isinstance(value, str) else None
    return ctx.bad_value(item, f"must be one of: {', '.join(BACKENDS)}, "
                               f"or a custom backend as package.module:ClassName", hint)


def report_keys_of_other_backends(ctx: Context, entries: dict, backend: str) -> None:
    """`provider:` on an Ascend accelerator is a misunderstanding worth a precise message."""
    for key, child in entries.items():
        if key in ONNXRUNTIME_FIELDS and backend != "onnxruntime":
            ctx.problem(child, f"applies only to backend onnxruntime (this accelerator's backend is {backend})")
        elif key in BACKEND_SECTIONS and key != backend:
            ctx.problem(child, f"the {key} section applies only to backend {key} "
                               f"(this accelerator's backend is {backend})")
        elif key == PLUGIN_OPTIONS_KEY and backend in BACKENDS:
            ctx.problem(child, f"only for custom backends (package.module:Class); "
                               f"{backend} takes its settings in {_settings_place(backend)}")


def _settings_place(backend: str) -> str:
    if backend in BACKEND_SECTIONS:
        return f"the {backend}: section"
    return "keys of the accelerator itself (provider, provider_options, ...)"


def read_onnxruntime(ctx: Context, entries: dict) -> Any:
    values = read_present(ctx, entries, ONNXRUNTIME_FIELDS)
    if INVALID in values.values():
        return INVALID
    return OnnxRuntimeConfig(**values)


def read_backend_options(ctx: Context, entries: dict, backend: str) -> Any:
    """The backend's own section: validated where the backend has a schema (ascend), else passed
    on unvalidated."""
    if backend == "ascend":
        return read_ascend_section(ctx, entries.get("ascend"))
    if backend == "simulated":
        return read_simulated_section(ctx, entries.get("simulated"))
    key = backend if backend in BACKEND_SECTIONS else PLUGIN_OPTIONS_KEY
    if key not in entries:
        return {}
    section = mapping_or_report(ctx, entries[key], optional=True)
    if section is None:
        return {} if entries[key].value is None else INVALID
    return {k: plain(v) for k, v in section.items()}

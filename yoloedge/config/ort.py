"""The ONNX Runtime backend's settings, which sit on the accelerator itself (`provider: cuda`).

ONNX Runtime was the first backend and the only one whose settings are not in a section of their
own; its keys stay where existing configs have them. `config.catalogue` names them as the keys this
backend owns, so another backend's accelerator that carries one is told so precisely.
"""

from __future__ import annotations

from typing import Any

from .fields import INVALID, Boolean, Choice, Context, Integer, Reader, Text, mapping_or_report, read_present
from .model import OnnxRuntimeConfig
from .providers import PROVIDERS
from .yamltree import Item

GRAPH_OPTIMIZATION = ("disable", "basic", "extended", "all")
#: ONNX Runtime threads per session: each thread has its own arena (100000 took 2.2 GB RSS);
#: a large server CPU has 192 cores, so 256 leaves room.
MAX_INTRA_OP_THREADS = 256


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


def read_cache_dir(ctx: Context, item: Item) -> Any:
    """A folder for compiled engines, resolved against the config file's folder; the backend creates
    it when a TensorRT or MIGraphX device opens, so it need not exist yet."""
    text = Text()(ctx, item)
    if text is INVALID:
        return INVALID
    return ctx.resolve_path(text)


ONNXRUNTIME_FIELDS: dict[str, Reader] = {
    "provider": Choice(tuple(PROVIDERS)),
    "provider_options": read_provider_options,
    "allow_fallback": Boolean(),
    "intra_op_threads": Integer(ge=0, le=MAX_INTRA_OP_THREADS, example=4),
    "graph_optimization": Choice(GRAPH_OPTIMIZATION),
    "qdq_fusion": Boolean(),
    "io_binding": Boolean(),
    "cache_dir": read_cache_dir,
}


def read_onnxruntime_settings(ctx: Context, entries: dict[str, Item]) -> Any:
    """The ONNX Runtime keys present on one accelerator, as an `OnnxRuntimeConfig`; INVALID after a
    report."""
    values = read_present(ctx, entries, ONNXRUNTIME_FIELDS)
    if INVALID in values.values():
        return INVALID
    return OnnxRuntimeConfig(**values)

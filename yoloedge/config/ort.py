"""The ONNX Runtime backend's settings, which sit on the accelerator itself (`provider: cuda`).

ONNX Runtime was the first backend and the only one whose settings are not in a section of their
own; its keys stay where existing configs have them. `config.catalogue` names them as the keys this
backend owns, so another backend's accelerator that carries one is told so precisely.
"""

from __future__ import annotations

from typing import Any

from .fields import INVALID, Boolean, Choice, Context, Integer, Key, Text, mapping_or_report, read_present
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


ONNXRUNTIME_FIELDS: dict[str, Key] = {
    "provider": Key(Choice(tuple(PROVIDERS)),
                    "ONNX Runtime execution provider (onnxruntime only)"),
    "provider_options": Key(read_provider_options,
                            "passed to the provider as strings (onnxruntime only)",
                            type="mapping of scalars"),
    "allow_fallback": Key(Boolean(),
                          "run on the CPU with a warning if the provider is missing (onnxruntime only)"),
    "intra_op_threads": Key(Integer(ge=0, le=MAX_INTRA_OP_THREADS, example=4),
                            "threads per inference; 0: ONNX Runtime's default (onnxruntime only)"),
    "graph_optimization": Key(Choice(GRAPH_OPTIMIZATION),
                              "(onnxruntime only)"),
    "qdq_fusion": Key(Boolean(),
                      "QDQ models: `true` keeps ONNX Runtime's default, Q/DQ pairs fused into int8 kernels (as "
                      "Ultralytics runs them); `false` runs them unfused in float, about 2x slower. Scores can "
                      "differ by one quantisation step between the two, and between CPUs (onnxruntime only)"),
    "io_binding": Key(Boolean(),
                      "bind preallocated input/output buffers (onnxruntime only)"),
    "cache_dir": Key(read_cache_dir,
                     "where TensorRT engines and MIGraphX programs are kept between starts (onnxruntime only)",
                     type="path",
                     default="`$CACHE_DIRECTORY`, else `$XDG_CACHE_HOME/yoloedge`, else `~/.cache/yoloedge`"),
}


def read_onnxruntime_settings(ctx: Context, entries: dict[str, Item]) -> Any:
    """The ONNX Runtime keys present on one accelerator, as an `OnnxRuntimeConfig`; INVALID after a
    report."""
    values = read_present(ctx, entries, ONNXRUNTIME_FIELDS)
    if INVALID in values.values():
        return INVALID
    return OnnxRuntimeConfig(**values)

"""The `ascend:` section of an accelerator: settings of the Huawei Ascend (pyACL) backend.

Kept small on purpose. What the model is (labels, format, anchors, `input: aipp`) lives in the
`model:` section, because an `.om` file carries no Ultralytics metadata and every accelerator runs
the same model; the tensor shapes, data types and batch gears come from the `.om` itself.

    ascend:
      execute: sync          # sync: acl.mdl.execute; async: execute_async + synchronize_stream
      source_onnx: yolov8n.onnx   # the ONNX the .om was converted from (for `yoloedge verify`)
      telemetry: true        # npu-smi health/temperature/memory/AI-core in the worker status

The loader keeps the validated values as a plain mapping in `AcceleratorConfig.options` (the place
`yoloedge verify` reads `source_onnx` from); `backends.backend_config_for` turns it into an
`AscendConfig` per device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import INVALID, Boolean, Choice, Context, Key, Text
from .yamltree import Item

EXECUTE_MODES = ("sync", "async")


@dataclass(frozen=True)
class AscendConfig:
    """Per-device settings handed to `AscendBackend`."""

    #: the NPU (logical device id, as `acl.rt.set_device` and `npu-smi info`'s Device column use it).
    device_id: int = 0
    #: "sync": `acl.mdl.execute`; "async": `acl.mdl.execute_async` on the worker's stream, then
    #: `acl.rt.synchronize_stream` (same result; lets the runtime queue the copies and the run).
    execute: str = "sync"
    #: the ONNX the .om was converted from, resolved against the config file's folder; only
    #: `yoloedge verify` reads it (the backend records it, nothing at run time depends on it).
    source_onnx: str | None = None
    #: poll `npu-smi info` (cached for a few seconds) for the worker's status.
    telemetry: bool = True


def read_source_onnx(ctx: Context, item: Item) -> Any:
    """A path, resolved against the config file's folder but not required to exist: it matters only
    to `yoloedge verify` (which reports a missing file itself), never to the running daemon."""
    text = Text(optional=True)(ctx, item)
    if text is None or text is INVALID:
        return text
    return ctx.resolve_path(text)


def source_onnx_key(made_from: str) -> Key:
    """The `source_onnx` key of a converted model's section (`ascend:`, `tensorrt:`); `made_from`
    says how the model came from it."""
    return Key(read_source_onnx,
               f"the ONNX {made_from}, for `yoloedge verify`; taken from the config file's folder, not checked here",
               type="path or null")


ASCEND_FIELDS: dict[str, Key] = {
    "execute": Key(Choice(EXECUTE_MODES),
                   "`acl.mdl.execute`, or `execute_async` on the worker's stream then `synchronize_stream`"),
    "source_onnx": source_onnx_key("the `.om` was converted from"),
    "telemetry": Key(Boolean(),
                     "add `npu-smi info` (health, temperature, power, memory, AI-core use; cached 5 s) to the "
                     "worker's status"),
}

"""The `ascend:` section of an accelerator: settings of the Huawei Ascend (pyACL) backend.

Kept small on purpose. What the model is (labels, format, anchors, `input: aipp`) lives in the
`model:` section, because an `.om` file carries no Ultralytics metadata and every accelerator runs
the same model; the tensor shapes, data types and batch gears come from the `.om` itself.

    ascend:
      execute: sync          # sync: acl.mdl.execute; async: copies and execute_async queued on the stream
      source_onnx: yolov8n.onnx   # the ONNX the .om was converted from (for `yoloedge verify`)
      telemetry: true        # npu-smi health/temperature/memory/AI-core in the worker status
      profile: /var/tmp/yoloedge-prof   # msprof data (acl.prof) of the first batches after open
      profile_batches: 100

The loader keeps the validated values as a plain mapping in `AcceleratorConfig.options` (the place
`yoloedge verify` reads `source_onnx` from); `backends.backend_config_for` turns it into an
`AscendConfig` per device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import INVALID, Boolean, Choice, Context, Integer, Key, Text
from .yamltree import Item

EXECUTE_MODES = ("sync", "async")


@dataclass(frozen=True)
class AscendConfig:
    """Per-device settings handed to `AscendBackend`."""

    #: the NPU (logical device id, as `acl.rt.set_device` and `npu-smi info`'s Device column use it).
    device_id: int = 0
    #: "sync": `acl.rt.memcpy` / `acl.mdl.execute` one after the other; "async": the copies
    #: (`memcpy_async`) and `execute_async` queued on the worker's stream between events, waited
    #: for at the last event (same result; the events time each step on the device).
    execute: str = "sync"
    #: the ONNX the .om was converted from, resolved against the config file's folder; only
    #: `yoloedge verify` reads it (the backend records it, nothing at run time depends on it).
    source_onnx: str | None = None
    #: poll `npu-smi info` (cached for a few seconds) for the worker's status.
    telemetry: bool = True
    #: a folder for msprof data (`acl.prof`) of the first `profile_batches` batches after open; None: off.
    profile: str | None = None
    profile_batches: int = 100


def read_source_onnx(ctx: Context, item: Item) -> Any:
    """A path, resolved against the config file's folder but not required to exist: it matters only
    to `yoloedge verify` (which reports a missing file itself), never to the running daemon."""
    text = Text(optional=True)(ctx, item)
    if text is None or text is INVALID:
        return text
    return ctx.resolve_path(text)


def read_profile_dir(ctx: Context, item: Item) -> Any:
    """A folder, resolved against the config file's folder; created when profiling starts."""
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
                   "`acl.mdl.execute` with synchronous copies, or copies and `execute_async` queued on the "
                   "worker's stream, timed by events"),
    "source_onnx": source_onnx_key("the `.om` was converted from"),
    "telemetry": Key(Boolean(),
                     "add `npu-smi info` (health, temperature, power, memory, AI-core use; cached 5 s) to the "
                     "worker's status"),
    "profile": Key(read_profile_dir,
                   "a folder for msprof data (`acl.prof`) of the first `profile_batches` batches after the "
                   "model is opened; taken from the config file's folder; null: no profiling",
                   type="path or null"),
    "profile_batches": Key(Integer(ge=1, le=100000), "how many batches `profile` records"),
}

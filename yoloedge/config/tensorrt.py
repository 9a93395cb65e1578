"""The `tensorrt:` section of an accelerator: settings of the native TensorRT backend.

Kept small on purpose, as the `ascend:` section is: what the model is (labels, format) lives in the
`model:` section, because an engine carries no Ultralytics metadata; tensor shapes, data types and
the batch range come from the engine itself.

    tensorrt:
      profile: 0                  # the engine's optimisation profile to run (trtexec builds one: 0)
      source_onnx: yolov8n.onnx   # the ONNX the engine was built from (for `yoloedge verify`)
      telemetry: true             # nvidia-smi (tegrastats on a Jetson) figures in the worker status

The loader keeps the validated values as a plain mapping in `AcceleratorConfig.options` (the place
`yoloedge verify` reads `source_onnx` from); `backends.backend_config_for` turns it into a
`TensorRTConfig` per device (both through the catalogue's entry, as for every section backend).
"""

from __future__ import annotations

from dataclasses import dataclass

from .ascend import source_onnx_key
from .fields import Boolean, Key, Integer

#: no trtexec command line builds more profiles than this; a larger index is a typo.
MAX_PROFILE = 63


@dataclass(frozen=True)
class TensorRTConfig:
    """Per-device settings handed to `TensorRTBackend`."""

    #: the GPU (CUDA device index, as `cudaSetDevice` and `nvidia-smi` number them).
    device_id: int = 0
    #: the optimisation profile the execution context runs; trtexec builds one (index 0).
    profile: int = 0
    #: the ONNX the engine was built from, resolved against the config file's folder; only
    #: `yoloedge verify` reads it (the backend records it, nothing at run time depends on it).
    source_onnx: str | None = None
    #: the GPU's temperature, load, memory and power (nvidia-smi; tegrastats on a Jetson), cached
    #: for a few seconds, in the worker's status.
    telemetry: bool = True


TENSORRT_FIELDS: dict[str, Key] = {
    "profile": Key(Integer(ge=0, le=MAX_PROFILE, example=0),
                   "the engine's optimisation profile to run (trtexec builds one, index 0); one the engine lacks is"
                   " refused when the worker opens, static engines included"),
    "source_onnx": source_onnx_key("the engine was built from"),
    "telemetry": Key(Boolean(),
                     "add the GPU's temperature, load, memory and power (nvidia-smi; tegrastats on a Jetson; cached"
                     " 5 s) to the worker's status"),
}

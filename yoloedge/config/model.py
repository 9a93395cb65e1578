"""Configuration of the detection core: the model and how it is run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

#: the folder under the cache root that holds ONNX Runtime's compiled engines and programs.
CACHE_APP_DIR = "yoloedge"


def default_cache_dir(environ: Mapping[str, str]) -> str:
    """Where compiled engines go when `cache_dir` is not set, from the environment given.

    systemd's `CacheDirectory=yoloedge` sets $CACHE_DIRECTORY (the unit runs with ProtectHome and
    ProtectSystem=strict, so nothing under the home or /var is writable without it); a user running
    the CLI gets the XDG cache folder. $CACHE_DIRECTORY may list several folders separated by ':'
    when a unit names several; the first is ours."""
    systemd = environ.get("CACHE_DIRECTORY", "").split(":")[0]
    if systemd:
        return systemd
    xdg = environ.get("XDG_CACHE_HOME", "")
    if os.path.isabs(xdg):  # the XDG spec: a relative value is invalid and ignored
        return os.path.join(xdg, CACHE_APP_DIR)
    home = environ.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".cache", CACHE_APP_DIR)


@dataclass(frozen=True)
class ModelConfig:
    path: str
    #: v5 | v8 | e2e | yolox | raw | raw_v8; None recognises the layout from shapes + metadata.
    format: str | None = None
    #: a labels file (one per line, or a YAML with `names`), a list, or None (metadata / COCO-80).
    labels: str | Sequence[str] | None = None
    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    #: None: the family's upstream default (class-agnostic for YOLOX, class-aware otherwise).
    agnostic_nms: bool | None = None
    #: keep only these classes (labels or ids); None keeps all.
    classes: Sequence[str | int] | None = None
    #: per-class minimum score, e.g. {"person": 0.5}.
    class_conf: Mapping[str | int, float] = field(default_factory=dict)
    #: input size (h, w) for models whose input axes are dynamic.
    imgsz: tuple[int, int] | None = None
    #: raw-head anchors in pixels, one list of w,h pairs per head; None: YOLOv5 defaults.
    anchors: Sequence[Sequence[float]] | None = None
    #: "host": float NCHW tensors normalised on the host; "aipp": uint8 NHWC (Ascend AIPP normalises).
    input: str = "host"
    #: letterbox placement "center" | "topleft"; None: the family's upstream default.
    letterbox: str | None = None
    #: channel order the model wants, "rgb" | "bgr"; None: the family's default.
    color: str | None = None
    #: divide pixel values by 255; None: the family's default (YOLOX takes 0-255).
    normalize: bool | None = None


@dataclass(frozen=True)
class OnnxRuntimeConfig:
    provider: str = "cpu"
    device_id: int = 0
    #: extra options handed to the execution provider, e.g. {"trt_fp16_enable": True}.
    provider_options: Mapping[str, object] = field(default_factory=dict)
    #: threads for one inference (0: ONNX Runtime's default, one per core).
    intra_op_threads: int = 0
    #: run on the CPU with a warning when the requested provider is unavailable, instead of failing.
    allow_fallback: bool = False
    #: ONNX Runtime graph optimisation: "disable" | "basic" | "extended" | "all".
    graph_optimization: str = "all"
    #: QDQ-quantised models: true (default) leaves ONNX Runtime's own session default, which fuses
    #: DequantizeLinear -> op -> QuantizeLinear into int8 kernels, as Ultralytics runs them; false
    #: disables that fusion (session.disable_quant_qdq) and runs the graph op by op in float. Both
    #: compute the graph up to rounding: integer kernels differ by instruction set (AVX2, AVX-512
    #: VNNI, AMX) and from the float path, so scores can differ by one quantisation step of the
    #: model's output either way; unfused is about 2x slower on the CPU.
    qdq_fusion: bool = True
    #: bind inputs/outputs to our preallocated buffers (no per-run allocation).
    io_binding: bool = True
    #: root of the on-disk caches of TensorRT engines and MIGraphX programs (one subfolder per
    #: model hash, batch, input size, precision and device, so a restart builds nothing). Resolved
    #: when the config is built: see `default_cache_dir`.
    cache_dir: str = field(default_factory=lambda: default_cache_dir(os.environ))

"""Configuration of the detection core: the model and how it is run."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Sequence

#: the output layouts `model.format` names (`postprocess.layouts` decodes each).
FORMATS = ("v5", "v8", "e2e", "yolox", "raw", "raw_v8")

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


def stem_name(path: str) -> str:
    """The name a model gets from its file (a single `model:`): the file's stem, with what a
    name may not hold (topic wildcards, `/`, spaces) replaced by `_`."""
    stem = os.path.splitext(os.path.basename(path))[0] or "model"
    return "".join("_" if ch in "/+#" or ch.isspace() else ch for ch in stem)


@dataclass(frozen=True)
class ModelConfig:
    """Each field is a key: its meaning, type and bounds are its Key in `config.models.MODEL_FIELDS`.
    `name` is what cameras and accelerators refer to, and what results say they came from; left
    empty, it is the file's stem (`stem_name`)."""

    path: str
    format: str | None = None
    labels: str | Sequence[str] | None = None
    conf: float = 0.25
    iou: float = 0.45
    max_det: int = 300
    agnostic_nms: bool | None = None
    classes: Sequence[str | int] | None = None
    class_conf: Mapping[str | int, float] = field(default_factory=dict)
    imgsz: tuple[int, int] | None = None
    anchors: Sequence[Sequence[float]] | None = None
    input: str = "host"
    letterbox: str | None = None
    color: str | None = None
    normalize: bool | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", stem_name(self.path))


@dataclass(frozen=True)
class OnnxRuntimeConfig:
    """Each field but `device_id` is a key: its meaning, type and bounds are its Key in
    `config.ort.ONNXRUNTIME_FIELDS`."""

    provider: str = "cpu"
    device_id: int = 0  # not a key: one per entry of the accelerator's `devices`
    provider_options: Mapping[str, object] = field(default_factory=dict)
    intra_op_threads: int = 0
    allow_fallback: bool = False
    graph_optimization: str = "all"
    qdq_fusion: bool = True
    io_binding: bool = True
    #: resolved when the config is built (`default_cache_dir`), so every worker uses one folder.
    cache_dir: str = field(default_factory=lambda: default_cache_dir(os.environ))

"""Every built-in backend, once: the one list that the schema, `yoloedge check`, the workers, the CLI
and the documentation all read.

Before this list, the schema accepted `backend: tensorrt` while the registry had no such backend:
`check` said OK and every worker then failed with "unknown backend". Now a name is valid exactly
when it has an entry here, and the entry carries everything about the backend that is not device
work:

* where its class lives (imported only when an accelerator uses it, so `acl` or `tensorrt` are
  never needed on a machine that does not use them);
* which accelerator keys hold its settings, how they are validated, and how they become the
  per-device settings object its constructor takes;
* which runtime modules it needs and what to install when they are missing (`check` looks for them
  without importing them);
* the model files it runs and one line for the docs.

The entries name their class by module path, not by import, so this module (and the config
package) never depends on a backend module: backends depend on config, not the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..runtime import module_installed
from .ascend import ASCEND_FIELDS, AscendConfig
from .fields import Context, Reader, read_section
from .ort import ONNXRUNTIME_FIELDS, read_onnxruntime_settings
from .providers import PROVIDER_TABLE
from .simulated import SIMULATED_FIELDS, SimulatedConfig
from .tensorrt import TENSORRT_FIELDS, TensorRTConfig
from .yamltree import Item

if TYPE_CHECKING:
    from .schema import AcceleratorConfig


@dataclass(frozen=True)
class BackendEntry:
    name: str
    #: "package.module" and class name of the `Backend` subclass, imported on first use.
    module: str
    class_name: str
    #: one line for `--help` and the README's backend table.
    summary: str
    #: model file suffixes this backend runs (the first is the usual one).
    model_suffixes: tuple[str, ...]
    #: modules the backend imports to reach its runtime; `check` reports a missing one.
    runtime_modules: tuple[str, ...]
    #: what to install when a runtime module is missing.
    install: str
    #: accelerator keys that hold this backend's settings (a section, or for ONNX Runtime its own keys).
    settings_keys: tuple[str, ...]
    #: (ctx, the accelerator's entries) -> AcceleratorConfig fields holding the validated settings;
    #: a value is INVALID after a report.
    read_settings: Callable[[Context, dict[str, Item]], dict[str, Any]]
    #: (accelerator, device index) -> the settings object the backend's constructor takes.
    device_config: Callable[[AcceleratorConfig, int], Any]

    def missing_runtime(self) -> str | None:
        """The first runtime module that cannot be found here, or None. Looks without importing it
        (only parent packages of a dotted name are imported): an import of `tensorrt` or `acl` can
        take seconds and touch the driver."""
        return next((module for module in self.runtime_modules if not module_installed(module)), None)


def _section_settings(key: str, fields: Mapping[str, Reader], config_class: Callable[..., Any]) -> dict[str, Any]:
    """The settings fields of the entry of a backend whose settings are one accelerator section
    (`ascend:`, `tensorrt:`, `simulated:`): validated with `fields` into `AcceleratorConfig.options`
    (absent or null: all defaults; INVALID after a report), and handed to the backend as
    `config_class` with the device index added (an unknown key is a TypeError: the loader lets
    none through, so it would be a programming error)."""
    def read_settings(ctx: Context, entries: dict[str, Item]) -> dict[str, Any]:
        return {"options": read_section(ctx, entries.get(key), fields)}

    def device_config(accelerator: AcceleratorConfig, device: int) -> Any:
        return config_class(**{**dict(accelerator.options), "device_id": device})

    return {"settings_keys": (key,), "read_settings": read_settings, "device_config": device_config}


def _onnxruntime_install() -> str:
    """What to install for ONNX Runtime: each build of the provider table, with its providers."""
    builds: dict[str, list[str]] = {}
    for provider in PROVIDER_TABLE:
        builds.setdefault(provider.distribution, []).append(provider.name)
    choices = [f"{distribution} ({', '.join(names)})" for distribution, names in builds.items()]
    return f"pip install the ONNX Runtime build for the provider: {', '.join(choices[:-1])} or {choices[-1]}"


def _onnxruntime_settings(ctx: Context, entries: dict[str, Item]) -> dict[str, Any]:
    return {"onnxruntime": read_onnxruntime_settings(ctx, entries)}


def _onnxruntime_device_config(accelerator: AcceleratorConfig, device: int) -> Any:
    return replace(accelerator.onnxruntime, device_id=device)


CATALOGUE: dict[str, BackendEntry] = {entry.name: entry for entry in (
    BackendEntry(
        name="onnxruntime", module="yoloedge.backends.onnxruntime", class_name="OnnxRuntimeBackend",
        summary="ONNX Runtime: CPU, or NVIDIA (CUDA, TensorRT) and AMD (MIGraphX) GPUs through its providers",
        model_suffixes=(".onnx",), runtime_modules=("onnxruntime",),
        install=_onnxruntime_install(),
        settings_keys=tuple(ONNXRUNTIME_FIELDS),
        read_settings=_onnxruntime_settings, device_config=_onnxruntime_device_config),
    BackendEntry(
        name="ascend", module="yoloedge.backends.ascend", class_name="AscendBackend",
        summary="Huawei Atlas (Ascend NPU) through CANN's pyACL, running .om models built by ATC",
        model_suffixes=(".om",), runtime_modules=("acl",),
        install="pyACL comes with Huawei CANN (it is NOT the PyPI package 'pyacl'): in a shell, source "
                "/usr/local/Ascend/ascend-toolkit/set_env.sh; for the service, write its variables with "
                "`yoloedge ascend-env -o /etc/yoloedge/ascend.env` (once after installing or upgrading CANN) "
                "and restart it",
        **_section_settings("ascend", ASCEND_FIELDS, AscendConfig)),
    BackendEntry(
        name="tensorrt", module="yoloedge.backends.tensorrt", class_name="TensorRTBackend",
        summary="NVIDIA TensorRT 8.6 / 10.x (Jetson, GPUs), running engines built by trtexec",
        model_suffixes=(".engine", ".plan", ".trt"), runtime_modules=("tensorrt", "cuda.bindings.runtime"),
        install="TensorRT comes with JetPack on Jetson (pip install tensorrt elsewhere) and "
                "pip install 'yoloedge[jetson]' for cuda-python",
        **_section_settings("tensorrt", TENSORRT_FIELDS, TensorRTConfig)),
    BackendEntry(
        name="simulated", module="yoloedge.backends.simulated", class_name="SimulatedBackend",
        summary="a simulated device that takes a set time per batch (capacity planning and tests)",
        model_suffixes=(".onnx",), runtime_modules=("onnxruntime",),
        install="pip install onnxruntime (the simulated device records its outputs with it)",
        **_section_settings("simulated", SIMULATED_FIELDS, SimulatedConfig)),
)}

#: registered backend names, in the order the docs list them.
BACKEND_NAMES: tuple[str, ...] = tuple(CATALOGUE)
#: the accelerator key that holds a custom backend's (`package.module:Class`) settings, unvalidated.
PLUGIN_OPTIONS_KEY = "options"


def owner_of_key(key: str) -> BackendEntry | None:
    """The backend whose settings live under accelerator key `key`, if any."""
    for entry in CATALOGUE.values():
        if key in entry.settings_keys:
            return entry
    return None

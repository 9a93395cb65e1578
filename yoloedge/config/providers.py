"""Every fact yoloedge keeps about an ONNX Runtime execution provider, in one table.

One row per `provider:` setting. Config validation reads the names from here without importing
ONNX Runtime or any backend (config imports only `model` and the root modules), and the backend
(`backends.onnxruntime`, `backends.ort_providers`, `backends.ort_gpu_check`,
`backends.ort_install`) reads the rest: adding a provider is adding a row.

Pure data: no onnxruntime import, nothing read from the environment.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class ProviderEntry:
    """One execution provider as yoloedge runs it."""

    #: the `provider:` setting (and `yoloedge detect --provider`)
    name: str
    #: ONNX Runtime's name for it, in `providers=` and `get_available_providers()`
    ort_name: str
    #: the device type OrtValues and IOBinding name its memory with: every GPU is "cuda", AMD's
    #: included (the Python layer maps "cuda" to the generic GPU device)
    device_type: str
    #: the pip distribution of ONNX Runtime that has it
    distribution: str
    #: compiles the model for the input shape it sees, slowly (TensorRT builds an engine, MIGraphX
    #: a program): it runs one shape, the accelerator's full batch, and caches it
    compiles: bool = False
    #: (provider-option key, precision name): the keys that make a compiled engine/program of
    #: another precision than fp32
    precision_options: tuple[tuple[str, str], ...] = ()
    #: the `gpu_smi.GpuKind` value of its devices' telemetry; "" for none
    telemetry: str = ""

    @property
    def gpu(self) -> bool:
        """Whether it runs on a GPU (and so is one `ort_gpu_check` compares against the CPU)."""
        return self.device_type != "cpu"


PROVIDER_TABLE: tuple[ProviderEntry, ...] = (
    ProviderEntry("cpu", "CPUExecutionProvider", "cpu", "onnxruntime"),
    ProviderEntry("cuda", "CUDAExecutionProvider", "cuda", "onnxruntime-gpu", telemetry="cuda"),
    ProviderEntry("tensorrt", "TensorrtExecutionProvider", "cuda", "onnxruntime-gpu", compiles=True,
                  precision_options=(("trt_fp16_enable", "fp16"), ("trt_bf16_enable", "bf16"),
                                     ("trt_int8_enable", "int8")),
                  telemetry="cuda"),
    ProviderEntry("migraphx", "MIGraphXExecutionProvider", "cuda", "onnxruntime-migraphx", compiles=True,
                  precision_options=(("migraphx_fp16_enable", "fp16"), ("migraphx_bf16_enable", "bf16"),
                                     ("migraphx_fp8_enable", "fp8"), ("migraphx_int8_enable", "int8")),
                  telemetry="rocm"),
    # onnxruntime-rocm <= 1.22 only; newer builds use migraphx
    ProviderEntry("rocm", "ROCMExecutionProvider", "cuda", "onnxruntime-rocm", telemetry="rocm"),
)

#: `provider` setting -> its row
PROVIDERS: Mapping[str, ProviderEntry] = {entry.name: entry for entry in PROVIDER_TABLE}
#: the providers that run on a GPU, in table order
GPU_PROVIDERS: tuple[str, ...] = tuple(entry.name for entry in PROVIDER_TABLE if entry.gpu)
#: distributions that install the `onnxruntime` module (names normalised as in PEP 503): those of
#: the providers above, and the builds for providers yoloedge does not run
ORT_DISTRIBUTIONS: tuple[str, ...] = tuple(dict.fromkeys(
    [entry.distribution for entry in PROVIDER_TABLE]
    + ["onnxruntime-directml", "onnxruntime-openvino", "onnxruntime-qnn"]))

"""ONNX Runtime backend: CPU, CUDA, TensorRT, MIGraphX (AMD) and ROCm execution providers.

Inputs and outputs are bound with IOBinding to host buffers allocated once in `open` (every
input set and every output set), so a run allocates no tensors. A dynamic batch axis runs the
whole batch in one call; a fixed batch runs the buffer in chunks of the model's batch, each chunk
bound to its own slice of the buffers. Bindings are built on first use per (input set, output
set, chunk) and kept.

On a GPU provider each input set also has its own device tensor (an OrtValue allocated once in
`open`): a run copies the host set into it with `update_inplace` (which copies into the tensor's
existing memory and refuses a size that differs, so the whole set is copied) and binds the first
n frames of it by address, so the model reads device memory and ONNX Runtime allocates no input
copy. Outputs stay bound to the host output sets: ONNX Runtime copies the results into them at the
end of the run, exactly the n frames bound. (Copying a device OrtValue into existing host memory has
no Python API before 1.23: `numpy()` and `copy_outputs_to_cpu()` allocate. 1.23 added
`copy_tensors`, which goes through the environment's data transfers; whether the built-in CUDA
EP's transfer is among them was not found in a source [UNCONFIRMED], so it is not relied on.)
The device type is a parameter, so the same path runs on the CPU in the tests.

TensorRT and MIGraphX compile the model for the input shape they see (minutes for a TensorRT
engine on a Jetson): they run one shape, the accelerator's full batch, keep what they compiled in
a folder keyed by model hash, batch, input size, precision and device (`ort_cache`), and are
warmed up in `open`, so the service reports READY with the engine built or loaded.
"""

from __future__ import annotations

import logging
import time
import warnings

import numpy as np
import onnxruntime as ort

from ..config.model import OnnxRuntimeConfig
from ..config.providers import PROVIDERS
from ..errors import BackendError, ModelError
from ..model.spec import DYNAMIC, ModelSpec, TensorSpec, channels_last, normalise_shape, parse_metadata
from .base import Backend, check_open_request, host_buffer, require_model_file
from .gpu_smi import GpuKind, gpu_telemetry
from .ort_cache import CacheKey, cache_folder, model_digest
from .ort_providers import cache_options, parse_version, precision, provider_entry

log = logging.getLogger(__name__)

_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}

DEFAULT_IMGSZ = (640, 640)

GRAPH_OPTIMIZATION = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


CPU_PROVIDER = PROVIDERS["cpu"].ort_name


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, model_path: str, config: OnnxRuntimeConfig | None = None, *,
                 device_type: str | None = None):
        """`device_type` stages the input sets in OrtValues on that device ("cuda", or "cpu" to run
        the GPU code path on the CPU); None: the provider's device, and none on the CPU provider."""
        self.model_path = str(model_path)
        self.config = config or OnnxRuntimeConfig()
        if self.config.provider not in PROVIDERS:
            raise BackendError(f"unknown ONNX Runtime provider {self.config.provider!r}: "
                               f"choose one of {', '.join(PROVIDERS)}")
        if self.config.graph_optimization not in GRAPH_OPTIMIZATION:
            raise BackendError(f"unknown graph_optimization {self.config.graph_optimization!r}: "
                               f"choose one of {', '.join(GRAPH_OPTIMIZATION)}")
        self._session: ort.InferenceSession | None = None
        self._inputs: list[np.ndarray] = []
        self._requested_device = device_type
        #: device the input sets are staged on (None: bound from host memory), and their tensors there.
        self._input_device: str | None = None
        self._device_inputs: list[ort.OrtValue] = []
        self._output_sets: list[list[np.ndarray]] = []
        self._bindings: dict[tuple[int, int, int, int], ort.IOBinding] = {}
        self._chunk = 1  # frames per native run: the fixed batch, or the whole request if dynamic
        self._dynamic_batch = False
        self._spec: ModelSpec | None = None
        self._memory: dict | None = None  # memory(): set at the end of open
        self.active_provider = ""
        #: where the provider keeps its compiled engine/program; "" for one that compiles nothing.
        self.cache_folder = ""

    # -- loading -------------------------------------------------------------------------------
    def open(self, max_batch: int = 1, input_hw: tuple[int, int] | None = None, *,
             input_sets: int = 1, output_sets: int = 1) -> ModelSpec:
        if self._session is not None and self._spec is not None:
            return self._spec
        check_open_request(max_batch, input_sets, output_sets)
        session = self._create_session(max_batch, input_hw)
        meta = parse_metadata(session.get_modelmeta().custom_metadata_map or {}, self.model_path)
        inputs = tuple(self._tensor_spec(i) for i in session.get_inputs())
        outputs = tuple(self._tensor_spec(o) for o in session.get_outputs())
        if len(inputs) != 1 or len(inputs[0].shape) != 4:
            raise ModelError(f"{self.model_path}: expected one 4-D image input, got "
                             + ", ".join(f"{i.name} {list(i.shape)}" for i in inputs))
        inp = inputs[0]
        shape = list(inp.shape)
        nhwc = channels_last(shape)
        hw_axes = (1, 2) if nhwc else (2, 3)
        if DYNAMIC in (shape[hw_axes[0]], shape[hw_axes[1]]):
            h, w = input_hw or meta.imgsz or DEFAULT_IMGSZ
            shape[hw_axes[0]], shape[hw_axes[1]] = h, w
        ch_axis = 3 if nhwc else 1
        if shape[ch_axis] == DYNAMIC:
            shape[ch_axis] = meta.channels or 3
        self._dynamic_batch = shape[0] == DYNAMIC
        self._chunk = max_batch if self._dynamic_batch else shape[0]
        if self._dynamic_batch and max_batch > 1 and _dynamically_quantised(self.model_path):
            # DynamicQuantizeLinear picks one scale for the whole tensor, i.e. for the whole
            # batch: a frame's scores would depend on the other frames batched with it.
            log.info("%s is dynamically quantised: running frames one at a time so that each "
                     "frame's result is independent of the others", self.model_path)
            self._dynamic_batch, self._chunk = False, 1
        elif self._dynamic_batch and self._compiles():
            self._dynamic_batch = False  # one shape, one engine: a partial batch runs padded
        capacity = -(-max_batch // self._chunk) * self._chunk
        shape[0] = capacity
        self._session = session
        self._inputs = [host_buffer(tuple(shape), inp.dtype) for _ in range(input_sets)]
        inp = TensorSpec(inp.name, tuple(shape), inp.dtype)
        self._spec = ModelSpec(self.model_path, (inp,), outputs, meta)
        if self.config.io_binding and all(DYNAMIC not in o.per_item_shape() for o in outputs):
            self._output_sets = [[host_buffer((capacity, *o.per_item_shape()), o.dtype) for o in outputs]
                                 for _ in range(output_sets)]
            self._input_device = self._staging_device()
            if self._input_device is not None:
                self._device_inputs = [self._device_tensor(buf) for buf in self._inputs]
        log.info("loaded %s on %s: input %s %s, outputs %s%s", self.model_path, self.active_provider,
                 inp.name, list(inp.shape), ", ".join(f"{o.name} {list(o.shape)}" for o in outputs),
                 f", inputs staged on {self._input_device}" if self._input_device else "")
        if self.active_provider != CPU_PROVIDER:
            self._warm_up()
        self._memory = self._count_memory()
        return self._spec

    def _count_memory(self) -> dict:
        """The buffers this backend allocated: host input and output sets, and the input sets
        staged on a device. The session's own memory (weights, arena) is ONNX Runtime's and not
        counted: 0 device bytes means none staged, not an idle GPU."""
        host = sum(b.nbytes for b in self._inputs) + sum(b.nbytes for outs in self._output_sets for b in outs)
        staged = len(self._device_inputs) * (self._inputs[0].nbytes if self._inputs else 0)
        on_device = self._input_device not in (None, "cpu")
        return {"device_bytes": staged if on_device else 0, "host_bytes": host + (0 if on_device else staged)}

    def memory(self) -> dict | None:
        memory = self._memory  # one reference read: any thread, no lock
        return dict(memory) if memory is not None else None

    def _compiles(self) -> bool:
        """Whether the session runs on a provider that compiles per input shape (TensorRT, MIGraphX)."""
        entry = PROVIDERS[self.config.provider]
        return entry.compiles and self.active_provider == entry.ort_name

    def _staging_device(self) -> str | None:
        """The device the input sets are staged on: the one asked for, else the provider's (none
        when the session runs on the CPU, where the host buffers are bound directly)."""
        if self._requested_device is not None:
            return self._requested_device
        if self.active_provider == CPU_PROVIDER:
            return None
        return PROVIDERS[self.config.provider].device_type

    def _staging_id(self) -> int:
        """The staging device's index: the provider's device, or 0 for the CPU (there is one)."""
        return 0 if self._input_device in (None, "cpu") else self.config.device_id

    def _device_tensor(self, host: np.ndarray) -> ort.OrtValue:
        """An OrtValue the shape of one host input set, on the staging device, allocated now.

        Whether every onnxruntime build allocates on "cuda" for AMD GPUs is not confirmed (newer
        Python layers have a MIGraphX allocator; early ROCm ones allocated CUDA memory only), so the
        error says how to run without staging."""
        device, device_id = self._input_device or "cpu", self._staging_id()
        try:
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(host.shape), host.dtype.type, device, device_id)
        except Exception as exc:  # ORT raises RuntimeError or its own types
            raise BackendError(f"OrtValue.ortvalue_from_shape_and_type({list(host.shape)}, {host.dtype}, "
                               f"{device!r}, {device_id}) failed: {_first_line(exc)}; with io_binding: false "
                               f"ONNX Runtime copies each batch to the device itself") from exc
        try:
            # The copy every run makes, tried once now: some builds allocate on a GPU they cannot
            # copy into ("Unsupported GPU device" from MIGraphX-only builds of some releases), and
            # that must fail the opening with its remedy, not every batch.
            value.update_inplace(host)
        except Exception as exc:  # ORT raises RuntimeError or its own types
            raise BackendError(f"OrtValue.update_inplace on {device!r} {device_id} failed: {_first_line(exc)}; "
                               f"with io_binding: false ONNX Runtime copies each batch to the device itself") from exc
        return value

    def _warm_up(self) -> None:
        """Run every batch size once now, so that what a GPU provider does on first sight of a shape
        (TensorRT builds or loads its engine, MIGraphX compiles, cuDNN picks convolution algorithms)
        happens before the service reports READY and not on the first frames."""
        started = time.monotonic()
        for n in self.batch_sizes:
            self.run(n)
        log.info("warmed up %s on %s in %.1f s%s", self.model_path, self.active_provider,
                 time.monotonic() - started, f" (engine cache {self.cache_folder})" if self.cache_folder else "")

    def _create_session(self, max_batch: int, input_hw: tuple[int, int] | None) -> ort.InferenceSession:
        require_model_file(self.model_path)
        cfg = self.config
        wanted = PROVIDERS[cfg.provider].ort_name
        compiles = PROVIDERS[cfg.provider].compiles
        cache: dict[str, str] = {}
        if compiles and wanted in ort.get_available_providers():
            self.cache_folder = cache_folder(cfg.cache_dir, self._cache_key(max_batch, input_hw))
            cache = cache_options(cfg.provider, parse_version(ort.__version__), self.cache_folder)
        entry = provider_entry(cfg.provider, cfg.device_id, cfg.provider_options, cache)
        providers = [entry] if cfg.provider == "cpu" else [entry, CPU_PROVIDER]
        opts = session_options(cfg)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                session = ort.InferenceSession(self.model_path, sess_options=opts, providers=providers)
        except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf/... types
            raise ModelError(f"cannot load model {self.model_path}: {_first_line(exc)}") from exc
        for w in caught:
            log.debug("onnxruntime: %s", w.message)
        # Once open, a provider that fails inside session.run() must fail that batch (the worker
        # reopens the device), not move the session to the CPU behind our back: ONNX Runtime's
        # Python layer would re-create it on the CPU, say so on stdout only, and active_provider
        # and the staged device tensors would then describe a session that no longer exists.
        session.disable_fallback()
        # A provider the build lacks, or whose libraries do not load, is only a warning to ONNX
        # Runtime, and one that fails to start is retried without it: either way the session
        # silently runs on the next provider in the list.
        self.active_provider = session.get_providers()[0]
        if self.active_provider != wanted:
            why, fix = _why_not_started(wanted)
            message = (f"ONNX Runtime provider {wanted} ({cfg.provider!r}) {why} "
                       f"(this build has: {', '.join(ort.get_available_providers())}); "
                       f"the session would run on {self.active_provider}")
            if not cfg.allow_fallback:
                raise BackendError(f"{message}. {fix}, or set allow_fallback: true to accept the CPU.")
            log.warning("%s (allow_fallback is set)", message)
        return session

    def _cache_key(self, max_batch: int, input_hw: tuple[int, int] | None) -> CacheKey:
        """What the compiled engine depends on. The input shape follows from the model, `max_batch`
        and `input_hw` (see `open`), so these key it without loading the model first."""
        cfg = self.config
        return CacheKey(model_sha256=model_digest(self.model_path), batch=max_batch, input_hw=input_hw,
                        precision=precision(cfg.provider, cfg.provider_options),
                        device=f"{cfg.provider}{cfg.device_id}", runtime=ort.__version__)

    @staticmethod
    def _tensor_spec(node) -> TensorSpec:
        dtype = _ORT_TYPES.get(node.type)
        if dtype is None:
            raise ModelError(f"tensor {node.name} has unsupported type {node.type}")
        return TensorSpec(node.name, normalise_shape(node.shape), np.dtype(dtype))

    # -- running -------------------------------------------------------------------------------
    @property
    def input_buffers(self) -> list[np.ndarray]:
        if not self._inputs:
            raise BackendError("backend is not open")
        return self._inputs

    @property
    def max_batch(self) -> int:
        return self._inputs[0].shape[0] if self._inputs else 0

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        if self._dynamic_batch:
            return tuple(range(1, self.max_batch + 1))
        return (self._chunk,)

    @property
    def description(self) -> str:
        return f"onnxruntime {ort.__version__} {self.active_provider}"

    def telemetry(self) -> dict | None:
        """The GPU's own view (nvidia-smi / tegrastats / rocm-smi, cached process-wide for a few
        seconds) while the session runs on a GPU provider; None on the CPU. Makes no ONNX Runtime
        call, so any thread may ask."""
        kind = PROVIDERS[self.config.provider].telemetry
        if not kind or self.active_provider in ("", CPU_PROVIDER):
            return None
        return gpu_telemetry(GpuKind(kind), self.config.device_id)

    def run(self, n: int, input_set: int = 0, output_set: int = 0) -> list[np.ndarray]:
        session, spec = self._session, self._spec
        if session is None or spec is None:
            raise BackendError("backend is not open")
        if not 1 <= n <= self.max_batch:
            raise BackendError(f"batch of {n} outside 1..{self.max_batch}")
        if not 0 <= input_set < len(self._inputs):
            raise BackendError(f"input set {input_set} outside 0..{len(self._inputs) - 1}")
        if not self._output_sets:
            return self._run_unbound(session, spec, n, self._inputs[input_set])
        if not 0 <= output_set < len(self._output_sets):
            raise BackendError(f"output set {output_set} outside 0..{len(self._output_sets) - 1}")
        if self._device_inputs:
            # Into the tensor's own memory; a copy of the whole set, as update_inplace takes no part.
            self._device_inputs[input_set].update_inplace(self._inputs[input_set])
        if self._dynamic_batch:
            self._run_bound(session, self._binding(session, spec, input_set, output_set, 0, n))
        else:
            for start in range(0, n, self._chunk):
                self._run_bound(session, self._binding(session, spec, input_set, output_set, start, self._chunk))
        return [o[:n] for o in self._output_sets[output_set]]

    def _run_bound(self, session: ort.InferenceSession, binding: ort.IOBinding) -> None:
        if self._device_inputs:
            # update_inplace copies with a plain cudaMemcpy, which from pageable memory may return
            # before the DMA is done, and the providers compute on streams of their own:
            # SynchronizeInputs has the input nodes' providers Sync() the device first.
            binding.synchronize_inputs()
        session.run_with_iobinding(binding)

    def _binding(self, session: ort.InferenceSession, spec: ModelSpec, input_set: int, output_set: int,
                 start: int, count: int) -> ort.IOBinding:
        """IOBinding of slots [start, start+count) of one input and one output set, built once."""
        key = (input_set, output_set, start, count)
        binding = self._bindings.get(key)
        if binding is None:
            binding = session.io_binding()
            i_spec = spec.input
            view = self._inputs[input_set][start:start + count]
            if self._device_inputs:
                address = self._device_inputs[input_set].data_ptr() + start * view[0].nbytes
                binding.bind_input(i_spec.name, self._input_device or "cpu", self._staging_id(),
                                   i_spec.dtype.type, list(view.shape), address)
            else:
                binding.bind_input(i_spec.name, "cpu", 0, i_spec.dtype.type, list(view.shape), view.ctypes.data)
            for o_spec, buf in zip(spec.outputs, self._output_sets[output_set]):
                out = buf[start:start + count]
                binding.bind_output(o_spec.name, "cpu", 0, o_spec.dtype.type, list(out.shape), out.ctypes.data)
            self._bindings[key] = binding
        return binding

    def _run_unbound(self, session: ort.InferenceSession, spec: ModelSpec, n: int,
                     inputs: np.ndarray) -> list[np.ndarray]:
        """Models with dynamic output shapes (or io_binding: false): ONNX Runtime allocates."""
        name = spec.input.name
        if self._dynamic_batch:
            return session.run(None, {name: inputs[:n]})
        parts = [session.run(None, {name: inputs[s:s + self._chunk]})
                 for s in range(0, n, self._chunk)]
        return [np.concatenate([p[i] for p in parts])[:n] for i in range(len(parts[0]))]

    def close(self) -> None:
        self._memory = None
        self._bindings.clear()
        self._output_sets = []
        self._device_inputs = []
        self._input_device = None
        self._inputs = []
        self._session = None


def session_options(cfg: OnnxRuntimeConfig) -> ort.SessionOptions:
    """The session options the backend runs `cfg` with (the fake pyACL in the tests uses them too)."""
    opts = ort.SessionOptions()
    if cfg.intra_op_threads:
        opts.intra_op_num_threads = cfg.intra_op_threads
    opts.log_severity_level = 3
    opts.graph_optimization_level = GRAPH_OPTIMIZATION[cfg.graph_optimization]
    if not cfg.qdq_fusion:
        opts.add_session_config_entry("session.disable_quant_qdq", "1")
    return opts


def _why_not_started(provider: str) -> tuple[str, str]:
    """(why a session does not run on `provider`, what to do): the build lacks it, or it is there
    and did not start -- then ONNX Runtime has said why (its log: a library that did not load; its
    stdout: "EP Error ... Falling back"), and installing another onnxruntime package is not the fix."""
    if provider not in ort.get_available_providers():
        return "is not available", "Install the matching onnxruntime package"
    return ("is in this build but did not start (ONNX Runtime's log or output just before says why)",
            "Fix what ONNX Runtime reported (often a missing CUDA, cuDNN, TensorRT or ROCm library, no usable "
            "GPU, or a provider option it refused)")


def _dynamically_quantised(path: str) -> bool:
    """True when the graph uses DynamicQuantizeLinear (its op type is stored as plain text)."""
    with open(path, "rb") as f:
        return b"DynamicQuantizeLinear" in f.read()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

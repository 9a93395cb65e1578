"""ONNX Runtime backend: CPU, CUDA, TensorRT, MIGraphX (AMD) and ROCm execution providers.

Inputs and outputs are bound with IOBinding to host buffers allocated once in `open` (every
input set and every output set), so a run allocates no tensors. A dynamic batch axis runs the
whole batch in one call; a fixed batch runs the buffer in chunks of the model's batch, each chunk
bound to its own slice of the buffers. Bindings are built on first use per (input set, output
set, chunk) and kept.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnxruntime as ort

from ..config.model import PROVIDERS, OnnxRuntimeConfig
from ..errors import BackendError, ModelError
from ..model.spec import DYNAMIC, ModelSpec, TensorSpec, channels_last, normalise_shape, parse_metadata
from .base import Backend, check_open_request, host_buffer, require_model_file

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


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(self, model_path: str, config: OnnxRuntimeConfig | None = None):
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
        self._output_sets: list[list[np.ndarray]] = []
        self._bindings: dict[tuple[int, int, int, int], ort.IOBinding] = {}
        self._chunk = 1  # frames per native run: the fixed batch, or the whole request if dynamic
        self._dynamic_batch = False
        self._spec: ModelSpec | None = None
        self.active_provider = ""

    # -- loading -------------------------------------------------------------------------------
    def open(self, max_batch: int = 1, input_hw: tuple[int, int] | None = None, *,
             input_sets: int = 1, output_sets: int = 1) -> ModelSpec:
        if self._session is not None and self._spec is not None:
            return self._spec
        check_open_request(max_batch, input_sets, output_sets)
        session = self._create_session()
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
        capacity = -(-max_batch // self._chunk) * self._chunk
        shape[0] = capacity
        self._session = session
        self._inputs = [host_buffer(tuple(shape), inp.dtype) for _ in range(input_sets)]
        inp = TensorSpec(inp.name, tuple(shape), inp.dtype)
        self._spec = ModelSpec(self.model_path, (inp,), outputs, meta)
        if self.config.io_binding and all(DYNAMIC not in o.per_item_shape() for o in outputs):
            self._output_sets = [[host_buffer((capacity, *o.per_item_shape()), o.dtype) for o in outputs]
                                 for _ in range(output_sets)]
        log.info("loaded %s on %s: input %s %s, outputs %s", self.model_path, self.active_provider,
                 inp.name, list(inp.shape), ", ".join(f"{o.name} {list(o.shape)}" for o in outputs))
        return self._spec

    def _create_session(self) -> ort.InferenceSession:
        require_model_file(self.model_path)
        cfg = self.config
        wanted = PROVIDERS[cfg.provider]
        providers: list = []
        if cfg.provider != "cpu":
            options = {"device_id": str(cfg.device_id)}
            options.update({k: str(v) for k, v in cfg.provider_options.items()})
            providers.append((wanted, options))
        providers.append("CPUExecutionProvider")
        opts = session_options(cfg)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                session = ort.InferenceSession(self.model_path, sess_options=opts, providers=providers)
        except Exception as exc:  # ORT raises its own Fail/InvalidProtobuf/... types
            raise ModelError(f"cannot load model {self.model_path}: {_first_line(exc)}") from exc
        for w in caught:
            log.debug("onnxruntime: %s", w.message)
        self.active_provider = session.get_providers()[0]
        if self.active_provider != wanted:
            message = (f"ONNX Runtime provider {wanted} ({cfg.provider!r}) is not available "
                       f"(this build has: {', '.join(ort.get_available_providers())}); "
                       f"the session would run on {self.active_provider}")
            if not cfg.allow_fallback:
                raise BackendError(message + ". Install the matching onnxruntime package, or set "
                                   "allow_fallback: true to accept the CPU.")
            log.warning("%s (allow_fallback is set)", message)
        return session

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
        if self._dynamic_batch:
            session.run_with_iobinding(self._binding(session, spec, input_set, output_set, 0, n))
        else:
            for start in range(0, n, self._chunk):
                session.run_with_iobinding(self._binding(session, spec, input_set, output_set, start, self._chunk))
        return [o[:n] for o in self._output_sets[output_set]]

    def _binding(self, session: ort.InferenceSession, spec: ModelSpec, input_set: int, output_set: int,
                 start: int, count: int) -> ort.IOBinding:
        """IOBinding of slots [start, start+count) of one input and one output set, built once."""
        key = (input_set, output_set, start, count)
        binding = self._bindings.get(key)
        if binding is None:
            binding = session.io_binding()
            i_spec = spec.input
            view = self._inputs[input_set][start:start + count]
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
        self._bindings.clear()
        self._session = None
        self._output_sets = []
        self._inputs = []


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


def _dynamically_quantised(path: str) -> bool:
    """True when the graph uses DynamicQuantizeLinear (its op type is stored as plain text)."""
    with open(path, "rb") as f:
        return b"DynamicQuantizeLinear" in f.read()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

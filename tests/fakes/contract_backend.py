"""A backend written against `yoloedge.backends.base.Backend` alone, to hold the pipeline to that
contract.

It subclasses `Backend` directly (not a shipped backend), computes real results with a plain ONNX
Runtime session, and refuses, as a real device runtime would, everything the contract forbids:
device calls from a thread other than the one that opened it, `run` before `open` or after
`close`, a batch larger than `max_batch`, an input or output set that was never allocated, and a
second `open` with different sizes. Every call goes into a journal (a JSON-lines file when the
accelerator's `options:` names one), so a daemon test can check afterwards what the pipeline did.

Used as `backend: contract_backend:ContractBackend` with tests/fakes on PYTHONPATH.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Sequence

import numpy as np
import onnxruntime as ort

from yoloedge.backends.base import Backend, check_open_request, host_buffer, require_model_file
from yoloedge.errors import BackendError
from yoloedge.model.spec import TensorSpec, ModelSpec, normalise_shape, parse_metadata

_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8}


class ContractViolation(BackendError):
    """The pipeline did something the Backend contract forbids."""


class ContractBackend(Backend):
    name = "contract"

    def __init__(self, model_path: str, options: dict | None = None):
        self.model_path = model_path
        self.options = dict(options or {})
        self.device = self.options.get("device_id", 0)
        self.journal: list[dict] = []
        self._journal_path = self.options.get("journal")
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._session: ort.InferenceSession | None = None
        self._opened_with: tuple | None = None
        self._inputs: list[np.ndarray] = []
        self._outputs: list[list[np.ndarray]] = []
        self._max_batch = 0
        self._spec: ModelSpec | None = None
        self._closed = False
        self.runs = 0

    # -- the journal ---------------------------------------------------------------------------
    def _note(self, event: str, **fields: Any) -> None:
        record = {"event": event, "device": self.device, "thread": threading.get_ident(), "id": id(self), **fields}
        with self._lock:
            self.journal.append(record)
            if self._journal_path:
                with open(self._journal_path, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record) + "\n")

    def _refuse(self, problem: str) -> None:
        self._note("violation", problem=problem)
        raise ContractViolation(problem)

    def _on_owner_thread(self, call: str) -> None:
        if self._owner != threading.get_ident():
            self._refuse(f"{call} from thread {threading.get_ident()}, but the device was opened on {self._owner}")

    # -- the contract --------------------------------------------------------------------------
    def open(self, max_batch: int, input_hw: tuple[int, int] | None = None, *,
             input_sets: int = 1, output_sets: int = 1) -> ModelSpec:
        request = (max_batch, input_hw, input_sets, output_sets)
        if self._closed:
            self._refuse("open after close (a reopen must construct a new backend)")
        if self._spec is not None:
            if request != self._opened_with:
                self._refuse(f"open again with {request}, first opened with {self._opened_with}")
            return self._spec
        check_open_request(max_batch, input_sets, output_sets)
        require_model_file(self.model_path)
        self._owner = threading.get_ident()
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(self.model_path, sess_options=options, providers=["CPUExecutionProvider"])
        node = session.get_inputs()[0]
        shape = list(normalise_shape(node.shape))
        if -1 in shape[1:]:
            self._refuse("this test backend runs models with a fixed image size only")
        shape[0] = max_batch
        dtype = np.dtype(_TYPES[node.type])
        outputs = []
        for out in session.get_outputs():
            per_item = normalise_shape(out.shape)[1:]
            if -1 in per_item:
                self._refuse("this test backend runs models with fixed output shapes only")
            outputs.append(TensorSpec(out.name, (max_batch, *per_item), np.dtype(_TYPES[out.type])))
        self._session = session
        self._max_batch = max_batch
        self._inputs = [host_buffer(tuple(shape), dtype) for _ in range(input_sets)]
        self._outputs = [[host_buffer(o.shape, o.dtype) for o in outputs] for _ in range(output_sets)]
        meta = parse_metadata(session.get_modelmeta().custom_metadata_map or {}, self.model_path)
        self._spec = ModelSpec(self.model_path, (TensorSpec(node.name, tuple(shape), dtype),), tuple(outputs), meta)
        self._opened_with = request
        self._note("open", max_batch=max_batch, input_sets=input_sets, output_sets=output_sets)
        return self._spec

    @property
    def input_buffers(self) -> Sequence[np.ndarray]:
        if not self._inputs:
            self._refuse("input_buffers before open")
        return self._inputs

    @property
    def max_batch(self) -> int:
        return self._max_batch

    @property
    def description(self) -> str:
        return f"contract test backend, device {self.device}"

    def run(self, n: int, input_set: int = 0, output_set: int = 0) -> list[np.ndarray]:
        if self._session is None or self._closed:
            self._refuse("run before open or after close")
        self._on_owner_thread("run")
        if not 1 <= n <= self._max_batch:
            self._refuse(f"run({n}) outside 1..max_batch {self._max_batch}")
        if not 0 <= input_set < len(self._inputs) or not 0 <= output_set < len(self._outputs):
            self._refuse(f"run with input set {input_set} / output set {output_set}, allocated "
                         f"{len(self._inputs)} / {len(self._outputs)}")
        assert self._session is not None and self._spec is not None
        name = self._spec.input.name
        outputs = self._outputs[output_set]
        for slot in range(n):
            results = self._session.run(None, {name: self._inputs[input_set][slot:slot + 1]})
            for buffer, result in zip(outputs, results):
                buffer[slot] = result[0]
        self.runs += 1
        self._note("run", n=n, input_set=input_set, output_set=output_set)
        return [buffer[:n] for buffer in outputs]

    def close(self) -> None:
        if self._spec is not None and not self._closed:
            self._on_owner_thread("close")
        first = not self._closed
        self._closed = True
        self._session = None
        self._inputs, self._outputs = [], []
        self._note("close", first=first)

    def telemetry(self) -> dict | None:
        return {"contract_runs": self.runs}

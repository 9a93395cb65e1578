"""Huawei Ascend NPUs through pyACL (CANN): one `.om` model on one card, every buffer allocated once.

Lifecycle, all on the worker thread that owns the card (pyACL binds contexts to threads):

    open:  [acl.init, first backend of the process]  [set_device -> create_context -> create_stream,
           first backend of the device scope] -> create_desc -> load_from_file -> get_desc -> device
           memory (sized for the largest batch gear; the image input one buffer per input set) +
           pinned host memory (acl.rt.malloc_host: one buffer per input set and per output set)
           -> data buffers -> one input dataset per input set (with its own
           `ascend_mbatch_shape_data` on dynamic-batch models), one output dataset (async: one per
           output set) -> [async: four events per output set] -> [ascend.profile: acl.prof init/create_config/start]
    run:   set_context -> set_dynamic_batch_size (smallest gear >= n) -> copy in (only the frames
           of this batch, from the chosen input set to its device buffer) -> execute -> copy out
           (into the chosen output set). sync: memcpy, execute, memcpy, timed by the host clock;
           async: `submit` queues record, memcpy_async, record, execute_async, record,
           memcpy_async(s), record (the output set's events); `complete` synchronize_event, the
           steps timed by event_elapsed_time (`last_timing`, per completed ticket)
    close: exactly the reverse: [profiling], events, datasets, data buffers, device and host memory,
           unload, destroy desc, [stream, context, reset_device, last backend of the device scope],
           [acl.finalize, last backend of the process]

Several models on one card: the backends of one device scope (`base.DeviceScope`: one worker
incarnation) share one context and one stream (`acl_runtime.DeviceContext`), and each keeps its
own description, datasets and buffers. One stream, not one per model: the worker runs one model's
batch at a time (on async at most two queued, of any of its models, which the stream runs in
order), so a stream per model would overlap nothing, and fewer streams is less of what a card has
a limited number of. A backend given no scope opens a private one: its own context and stream, as with one model.
On async the backend pipelines (`submit` queues, `complete` waits): the worker keeps up to two
batches queued on the one stream, which runs them in order (the host's side overlaps the card's
work; a copy never overlaps another batch's execution: that would need a second stream).

Every acquisition pushes its own undo step, so `close` (and a failed `open`) release precisely
what was acquired, in reverse order, and a failing step does not stop the ones after it. The
open/run/close skeleton around these calls is `device.PinnedDeviceBackend`'s, shared with the
other backends that own pinned host buffers; this module holds only the device calls.

The letterbox writes straight into the pinned host memory: each of `input_buffers` is a numpy view
of one pinned input set (`acl.util.ptr_to_numpy`), and the arrays `run` returns are views of one
pinned output set. Each input set has its own device buffer (`_input_device_buffer`, the one place
it is allocated) and input dataset, so a copy queued on the stream for one set never overwrites
what another set's batch reads; on async each output set also has its own device output buffers,
output dataset and four events, so two batches in flight never share any (sync shares one device
buffer per output). Shapes and data types come from
the model description, so an `.om` with AIPP (uint8 NHWC input, normalised on the NPU) and one
without (float32/float16 NCHW) both work, and an `.om` exported without its Detect layer exposes
its raw feature maps for the `raw` decoder. An `.om` carries no Ultralytics metadata: labels and
format come from the `model:` section of the config.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
import math

import acl
import numpy as np

from ..config.ascend import EXECUTE_MODES, AscendConfig
from ..errors import BackendError, ModelError
from ..model.spec import DYNAMIC, ModelSpec
from . import acl_observe as observe
from . import acl_runtime as rt
from . import ascend_nv12 as nv12
from .acl_runtime import check, checked
from .base import BatchTiming, require_model_file
from .device import DeviceTensor, PinnedDeviceBackend
from .npu_smi import NPU_SMI
from .undo import UndoStack

log = logging.getLogger(__name__)


class HostView:
    """The numpy side of one pinned host buffer.

    Normally `array` shares the pinned memory, so writing it is writing what the next copy to the
    device reads. Where pyACL cannot give such a view, `array` is plain memory staged through
    `bytes` on every copy (slower, and logged once).
    """

    def __init__(self, ptr: int, nbytes: int):
        self.ptr = ptr
        self.nbytes = nbytes
        shared = rt.host_array(ptr, nbytes)
        if shared is None and not rt.can_stage():
            raise BackendError("this pyACL gives no numpy view of pinned memory (acl.util.ptr_to_numpy) "
                               "and has no acl.util.bytes_to_ptr/ptr_to_bytes to copy through")
        self.staged = shared is None
        self.array = shared if shared is not None else np.zeros(nbytes, np.uint8)

    def source(self, count: int) -> tuple[int, bytes | None]:
        """Where to copy the first `count` bytes from, and an object to keep alive until then."""
        if not self.staged:
            return self.ptr, None
        blob = self.array[:count].tobytes()
        return acl.util.bytes_to_ptr(blob), blob

    def landed(self, count: int) -> None:
        """`count` bytes were copied into the pinned memory: make them visible in `array`."""
        if self.staged:
            self.array[:count] = np.frombuffer(acl.util.ptr_to_bytes(self.ptr, count), np.uint8)


#: one model input or output (`device_bytes`: what the model description asks for, the largest
#: gear); its pinned host buffers are kept as `HostView`s
Tensor = DeviceTensor[HostView]


class AscendBackend(PinnedDeviceBackend[HostView]):
    """`device.PinnedDeviceBackend` filled in with pyACL calls."""

    name = "ascend"
    fixed_when = "at conversion"
    device_input_per_set = True

    def __init__(self, model_path: str, config: AscendConfig | None = None):
        config = config or AscendConfig()
        if config.execute not in EXECUTE_MODES:
            raise BackendError(f"unknown execute mode {config.execute!r}: choose one of "
                               f"{', '.join(EXECUTE_MODES)}")
        super().__init__(model_path, config)
        self.config: AscendConfig
        self._process = rt.PROCESS  # the same one from open to close, whatever replaces it later
        self._process.register(self)

    def _reset_state(self) -> None:
        super()._reset_state()
        self._context = 0
        self._stream = 0
        self._model_id: int | None = None
        self._desc = 0
        self._mbatch: Tensor | None = None  # ascend_mbatch_shape_data, dynamic-batch models only
        self._input_datasets: list[int] = []  # one per input set: each binds that set's device buffers
        self._output_datasets: list[int] = []  # one per output set on async (its own device buffers), else one
        self._event_sets: list[observe.StepEvents] = []  # async with pinned views only: one per output set
        self._async_copies = False  # async with pinned views: copies queued on the stream too
        self._model_soc: str | None = None  # the --soc_version the .om was built for, where found
        self._cann = ""
        self._problems: list[str] = []
        self._profiler: observe.Profiling | None = None
        self._model_batch = 0  # the static batch, or the largest gear
        self._gears: tuple[int, ...] = ()  # usable dynamic-batch gears; () for a static batch
        self._gear_for: list[int] = []  # n -> gear to run a batch of n frames
        self._memcpy_in = rt.ACL_MEMCPY_HOST_TO_DEVICE
        self._memcpy_out = rt.ACL_MEMCPY_DEVICE_TO_HOST
        self._soc = ""
        self.aipp = False

    def _settle(self) -> None:
        self._process.settle(self)

    def _tensors(self) -> list[Tensor]:
        return [*super()._tensors(), *([self._mbatch] if self._mbatch is not None else [])]

    # -- open ----------------------------------------------------------------------------------
    def _open(self, max_batch: int, input_sets: int, output_sets: int) -> ModelSpec:
        require_model_file(self.model_path)
        self._process.acquire()
        self._undo.push("release pyACL (acl.finalize when last)", self._process.release)
        self._open_device()
        self._load_model()
        self._describe(max_batch)
        self._allocate(input_sets, output_sets)
        self._build_datasets()
        if self._async_copies:  # one set per output set: each batch in flight has its own
            self._event_sets = [observe.StepEvents(self._undo, self._stream) for _ in self._outputs[0].hosts]
        if self.config.profile:
            self._profiler = observe.Profiling.start(self.config.profile, self.config.device_id,
                                                self.config.profile_batches, self.model_path)
            if self._profiler is not None:
                self._undo.push("stop profiling", self._profiler.stop)
        spec = self._spec = self._model_spec()
        log.info("loaded %s on %s: input %s %s%s, outputs %s", self.model_path, self.description,
                 spec.input.name, list(spec.input.shape), " (AIPP)" if self.aipp else "",
                 ", ".join(f"{o.name} {list(o.shape)}" for o in spec.outputs))
        return spec

    def _open_device(self) -> None:
        """The card's context and stream, shared by every model of this backend's scope (created
        by the first, released after the last; see `acl_runtime.DeviceContext`)."""
        device = self.config.device_id
        shared = self._shared(f"ascend device {device}", lambda: rt.open_context(device), rt.close_context)
        check(acl.rt.set_context(shared.context), "acl.rt.set_context", f"device {device}")
        self._context, self._stream = shared.context, shared.stream
        self._memcpy_in, self._memcpy_out, self._soc = shared.memcpy_in, shared.memcpy_out, shared.soc
        self._cann = shared.cann

    def _load_model(self) -> None:
        desc = acl.mdl.create_desc()
        if not desc:
            raise BackendError("acl.mdl.create_desc returned no model description")
        self._desc = desc
        self._undo.push("destroy model description",
                   lambda: check(acl.mdl.destroy_desc(desc), "acl.mdl.destroy_desc"))
        model_id = checked(acl.mdl.load_from_file(self.model_path), "acl.mdl.load_from_file", self.model_path)
        self._model_id = model_id
        self._undo.push("unload model", lambda: check(acl.mdl.unload(model_id), "acl.mdl.unload"))
        check(acl.mdl.get_desc(desc, model_id), "acl.mdl.get_desc")
        self._model_soc = observe.model_soc(self.model_path)
        problem = observe.soc_problem(self.model_path, self._model_soc, self._soc, self.config.device_id)
        if problem:
            log.warning("%s", problem)
            self._problems.append(problem)

    # -- what the model wants ------------------------------------------------------------------
    def _describe(self, max_batch: int) -> None:
        """Everything about the tensors comes from the model description (`ModelTensors`)."""
        tensors = ModelTensors.read(self.model_path, self._desc, self._model_id)
        self._model_batch = tensors.model_batch
        self._plan_batches(tensors.gears, max_batch)
        self._input, self.aipp = tensors.image, tensors.aipp
        self._mbatch, self._outputs = tensors.mbatch, tensors.outputs

    def _plan_batches(self, gears: tuple[int, ...], max_batch: int) -> None:
        self._capacity, self._gears, self._gear_for = plan_batches(gears, self._model_batch, max_batch)
        if self._capacity != max_batch:
            log.info("%s: batches of up to %d frames (asked for %d; the model's %s)", self.model_path,
                     self._capacity, max_batch, f"gears are {list(gears)}" if gears else "batch is fixed")

    # -- buffers -------------------------------------------------------------------------------
    def _allocate(self, input_sets: int, output_sets: int) -> None:
        """Device buffers as the description sizes them; pinned host buffers for `capacity`
        frames, one per input set (the image input) and per output set (every output)."""
        self._allocate_sets(input_sets, output_sets)
        inp = self._image
        if self._mbatch is not None:  # one per input set, as the dataset it belongs to
            self._mbatch.device_ptrs = [self._malloc(self._mbatch.device_bytes) for _ in range(input_sets)]
            self._mbatch.device_ptr = self._mbatch.device_ptrs[0]
        staged = any(h.staged for t in (inp, *self._outputs) for h in t.hosts)
        if staged:
            log.warning("%s: pyACL gives no shared numpy view of pinned memory here; every run copies "
                        "through bytes (slower%s)", self.model_path,
                        "; execute: async runs its copies synchronously" if self.config.execute == "async" else "")
        self._async_copies = self.config.execute == "async" and not staged
        for input_set, array in enumerate(inp.arrays):
            array[...] = 0  # padding slots of a gear start as zeros, not garbage
            if self.nv12:  # the card's own memory: the letterbox grey (see `_fill_nv12`)
                nv12.fill_grey(inp.device_ptrs[input_set], inp.device_bytes, inp.item_bytes)
            else:
                self._copy_in_now(inp, self._capacity, input_set)

    def _device_output_per_set(self) -> bool:
        """Async: two batches may be queued at once (`pipelined`), each executing into its own
        output set's device buffers."""
        return self.config.execute == "async"

    @property
    def _events(self) -> observe.StepEvents | None:
        """The events of the batch in hand (its output set's), None where nothing is timed by events."""
        return self._event_sets[self._output_set] if self._event_sets else None

    @property
    def _output_dataset(self) -> int:
        return self._output_datasets[self._output_set if len(self._output_datasets) > 1 else 0]

    @property
    def pipelined(self) -> bool:
        """Async with pinned views: `submit` queues the batch on the stream and returns; the
        worker may then submit the next one before it `complete`s this one."""
        return bool(self._event_sets)

    def _malloc(self, nbytes: int) -> int:
        ptr = checked(acl.rt.malloc(int(nbytes), rt.ACL_MEM_MALLOC_HUGE_FIRST), "acl.rt.malloc", f"{nbytes} bytes")
        self._undo.push("free device memory", lambda: check(acl.rt.free(ptr), "acl.rt.free"))
        return ptr

    def _pinned(self, nbytes: int) -> tuple[HostView, np.ndarray]:
        ptr = checked(acl.rt.malloc_host(int(nbytes)), "acl.rt.malloc_host", f"{nbytes} bytes")
        self._undo.push("free host memory", lambda: check(acl.rt.free_host(ptr), "acl.rt.free_host"))
        host = HostView(ptr, nbytes)
        return host, host.array

    def _build_datasets(self) -> None:
        """Data buffers wrapping the device buffers, then one input dataset per input set (its own
        image and batch-size buffers), one output dataset per output set where each has its own
        device buffers (async), else one."""
        inputs = sorted([t for t in (self._input, self._mbatch) if t is not None], key=lambda t: t.index)
        undo = self._undo
        in_buffers = [[data_buffer(undo, t, t.device_ptrs[s]) for t in inputs] for s in range(len(self._image.hosts))]
        out_sets = len(self._outputs[0].device_ptrs) or 1
        out_buffers = [[data_buffer(undo, t, t.device_ptrs[s] if t.device_ptrs else t.device_ptr)
                        for t in self._outputs] for s in range(out_sets)]
        self._input_datasets = [dataset(undo, buffers) for buffers in in_buffers]  # one per input set
        self._output_datasets = [dataset(undo, buffers) for buffers in out_buffers]

    def _output_batch(self) -> int:
        return DYNAMIC if self._gears else self._model_batch

    def _imgsz(self) -> tuple[int, int]:
        shape = self._image.item_shape
        if self.nv12:
            return shape[0] * 2 // 3, shape[1]
        return (shape[0], shape[1]) if self.aipp else (shape[1], shape[2])

    # -- NV12 input: the card's DVPP fills it (decoder: dvpp; see `ascend_nv12`) ---------------
    @property
    def nv12(self) -> bool:
        return self._input is not None and self.aipp and len(self._input.item_shape) == 2

    def _model_spec(self) -> ModelSpec:
        spec = super()._model_spec()
        return nv12.as_rgb(spec, self._capacity, *self._imgsz()) if self.nv12 else spec

    def _input_device_buffer(self, nbytes: int) -> int:
        return nv12.dvpp_buffer(self._undo, nbytes) if self.nv12 else super()._input_device_buffer(nbytes)

    @property
    def device_inputs(self) -> list[tuple[int, int]] | None:
        if self._spec is None or not self.nv12:
            return None
        return [(ptr, self._image.item_bytes) for ptr in self._image.device_ptrs]

    # -- running -------------------------------------------------------------------------------
    @property
    def batch_sizes(self) -> tuple[int, ...]:
        if self._spec is None:
            return ()
        return self._gears or (self._model_batch,)

    @property
    def warm_up_batches(self) -> tuple[int, ...]:
        return warm_up_sizes(self._gears, self._capacity)

    @property
    def description(self) -> str:
        batch = "gears " + "/".join(map(str, self._gears)) if self._gears else f"batch {self._model_batch}"
        cann = f" CANN {self._cann}" if self._cann else ""
        soc = f" {self._soc}" if self._soc else ""
        return f"ascend{cann}{soc} device {self.config.device_id} ({self.config.execute}, {batch})"

    def _activate(self, detail: str = "") -> None:
        if self._context:  # pyACL binds contexts to threads
            check(acl.rt.set_context(self._context), "acl.rt.set_context", detail)

    def _set_batch_for(self, n: int) -> None:
        """A dynamic-batch model runs the smallest gear >= n."""
        if self._mbatch is not None:
            gear = self._gear_for[n]
            dataset = self._input_datasets[self._input_set]
            check(acl.mdl.set_dynamic_batch_size(self._model_id, dataset, self._mbatch.index, gear),
                  "acl.mdl.set_dynamic_batch_size", f"batch {gear}")

    def _copy_input(self, inp: Tensor, n: int, input_set: int) -> None:
        if self.nv12:  # already on the card: letterboxed there by VPC
            if self._events is not None:
                self._events.record(observe.StepEvents.COPY_IN)
            return
        if self._events is None:
            self._copy_in_now(inp, n, input_set)
            return
        count = n * inp.item_bytes
        self._events.record(observe.StepEvents.COPY_IN)
        check(acl.rt.memcpy_async(inp.device_ptrs[input_set], inp.device_bytes, inp.hosts[input_set].ptr, count,
                                  self._memcpy_in, self._stream),
              "acl.rt.memcpy_async", f"input {inp.name}, {count} bytes to the device")

    def _copy_in_now(self, inp: Tensor, n: int, input_set: int) -> None:
        """The synchronous copy of the first n frames of an input set to that set's device buffer."""
        host = inp.hosts[input_set]
        count = n * inp.item_bytes
        src, keep_alive = host.source(count)
        kind = rt.ACL_MEMCPY_HOST_TO_DEVICE if host.staged else self._memcpy_in
        check(acl.rt.memcpy(inp.device_ptrs[input_set], inp.device_bytes, src, count, kind), "acl.rt.memcpy",
              f"input {inp.name}, {count} bytes to the device")
        del keep_alive

    def _execute(self) -> None:
        dataset = self._input_datasets[self._input_set]
        if self._events is not None:
            self._events.record(observe.StepEvents.EXECUTE)
            check(acl.mdl.execute_async(self._model_id, dataset, self._output_dataset, self._stream),
                  "acl.mdl.execute_async")
            self._events.record(observe.StepEvents.COPY_OUT)
        elif self.config.execute == "async":  # staged copies: only the execution is queued
            check(acl.mdl.execute_async(self._model_id, dataset, self._output_dataset, self._stream),
                  "acl.mdl.execute_async")
            check(acl.rt.synchronize_stream(self._stream), "acl.rt.synchronize_stream")
        else:
            check(acl.mdl.execute(self._model_id, dataset, self._output_dataset), "acl.mdl.execute")

    def _copy_output(self, out: Tensor, n: int, output_set: int) -> None:
        host = out.hosts[output_set]
        count = n * out.item_bytes
        if self._events is not None:
            check(acl.rt.memcpy_async(host.ptr, host.nbytes, out.device_ptrs[output_set], count, self._memcpy_out,
                                      self._stream),
                  "acl.rt.memcpy_async", f"output {out.name}, {count} bytes from the device")
            return
        check(acl.rt.memcpy(host.ptr, host.nbytes, out.device_ptrs[output_set] if out.device_ptrs else out.device_ptr,
                            count, self._memcpy_out),
              "acl.rt.memcpy", f"output {out.name}, {count} bytes from the device")
        host.landed(count)

    def _quiesce(self) -> None:
        """Async: a batch submitted and never completed (a worker that failed between the two)
        may still be queued: wait for the stream before its buffers are freed."""
        if self._event_sets and self._stream:
            check(acl.rt.synchronize_stream(self._stream), "acl.rt.synchronize_stream", "before teardown")

    def _queued(self) -> None:
        """Async: the event after the last copy-out, recorded when the batch is submitted."""
        if self._events is not None:
            self._events.record(observe.StepEvents.END)

    def _synchronize(self) -> None:
        """Async: wait for the event after this batch's last copy-out (the stream runs in order, so
        every copy and the execution before it are done, and those of any batch submitted earlier);
        then count the batch for the profiler."""
        if self._events is not None:
            self._events.wait()
        if self._profiler is not None and self._profiler.batch_done():
            self._profiler = None

    def _timing(self, host: tuple[float, float, float, float]) -> BatchTiming | None:
        """Async: the device's own times between the events; sync: the host clock around each
        synchronous call; async with staged copies: the whole run counts as execution."""
        if self._events is not None:
            return self._events.timing()
        if self.config.execute == "sync":
            return BatchTiming(host[1] - host[0], host[2] - host[1], host[3] - host[2], "host")
        return super()._timing(host)

    def runtime_info(self) -> dict | None:
        """The CANN version, the card's SoC and the .om's, and what is wrong with them; no pyACL
        call (read once at open), so any thread may ask."""
        if self._spec is None:
            return None
        return {"cann": self._cann or None, "soc": self._soc or None, "model_soc": self._model_soc,
                "problems": list(self._problems)}

    # -- telemetry -----------------------------------------------------------------------------
    def telemetry(self) -> dict | None:
        """npu-smi's view of this card (health, temperature, power, memory, AI-core use), cached
        process-wide for a few seconds; None where npu-smi is absent or telemetry is off. Makes no
        pyACL call, so any thread (the status socket's) may ask."""
        if not self.config.telemetry:
            return None
        return NPU_SMI.device(self.config.device_id)


# -- reading the model description ---------------------------------------------------------------
def dynamic_gears(desc: int) -> tuple[int, ...]:
    """The --dynamic_batch_size gears, sorted; () for a fixed-batch model (batchCount 0)."""
    info = checked(acl.mdl.get_dynamic_batch(desc), "acl.mdl.get_dynamic_batch")
    if not info or not info.get("batchCount"):
        return ()
    return tuple(sorted(int(g) for g in info["batch"][:info["batchCount"]]))


def mbatch_index(desc: int) -> int | None:
    """Index of the batch-size input; pyACL answers a non-zero ret when the model has none."""
    index, ret = acl.mdl.get_input_index_by_name(desc, rt.ACL_DYNAMIC_TENSOR_NAME)
    return int(index) if ret == rt.ACL_SUCCESS else None


@dataclass(frozen=True)
class ModelTensors:
    """What a loaded model's description says: its batch gears, the batch-size input, the image
    input (AIPP or not) and the outputs."""

    gears: tuple[int, ...]
    model_batch: int  # the static batch, or the largest gear
    image: Tensor
    aipp: bool
    mbatch: Tensor | None  # ascend_mbatch_shape_data, dynamic-batch models only
    outputs: list[Tensor]

    @classmethod
    def read(cls, model_path: str, desc: int, model_id: int | None) -> ModelTensors:
        gears = dynamic_gears(desc)
        mbatch = mbatch_index(desc)
        if gears and mbatch is None:
            raise ModelError(f"{model_path}: dynamic batch gears {list(gears)} but no "
                             f"{rt.ACL_DYNAMIC_TENSOR_NAME} input")
        if mbatch is not None and not gears:
            raise ModelError(f"{model_path}: dynamic image size / dynamic dims models are not supported; "
                             f"convert with --input_shape fixed, or --dynamic_batch_size")
        images = [i for i in range(acl.mdl.get_num_inputs(desc)) if i != mbatch]
        if len(images) != 1:
            raise ModelError(f"{model_path}: expected one image input, the model has {len(images)} "
                             f"(dynamic AIPP models are not supported: use a static AIPP block)")
        dims, name = tensor_dims(acl.mdl.get_input_dims(desc, images[0]), "acl.mdl.get_input_dims", "images")
        model_batch = max(gears) if gears else dims[0]
        if model_batch < 1:
            raise ModelError(f"{model_path}: input batch {dims[0]} without dynamic batch gears")
        image, aipp = image_tensor(model_path, desc, model_id, images[0], dims, name, model_batch)
        batch_input = None
        if mbatch is not None:
            size = acl.mdl.get_input_size_by_index(desc, mbatch)
            batch_input = Tensor(rt.ACL_DYNAMIC_TENSOR_NAME, np.dtype(np.int64), (1,), size, size, mbatch)
        outputs = [output_tensor(model_path, desc, i, model_batch) for i in range(acl.mdl.get_num_outputs(desc))]
        return cls(gears, model_batch, image, aipp, batch_input, outputs)


def data_buffer(undo: UndoStack, tensor: Tensor, device_ptr: int) -> int:
    """A data buffer wrapping `tensor`'s device memory at `device_ptr` (destroyed by `undo`)."""
    buffer = acl.create_data_buffer(device_ptr, tensor.device_bytes)
    if not buffer:
        raise BackendError(f"acl.create_data_buffer returned no buffer for {tensor.name}")
    undo.push("destroy data buffer", lambda: check(acl.destroy_data_buffer(buffer), "acl.destroy_data_buffer"))
    return buffer


def dataset(undo: UndoStack, buffers: list[int]) -> int:
    """A dataset of `buffers`, in order (destroyed by `undo`)."""
    handle = acl.mdl.create_dataset()
    if not handle:
        raise BackendError("acl.mdl.create_dataset returned no dataset")
    undo.push("destroy dataset", lambda: check(acl.mdl.destroy_dataset(handle), "acl.mdl.destroy_dataset"))
    for buffer in buffers:
        checked(acl.mdl.add_dataset_buffer(handle, buffer), "acl.mdl.add_dataset_buffer")
    return handle


def plan_batches(gears: tuple[int, ...], model_batch: int, max_batch: int
                 ) -> tuple[int, tuple[int, ...], list[int]]:
    """(capacity, usable gears, gear for n frames). Capacity: `max_batch` frames, at most the
    largest gear or the static batch. Each n <= capacity runs on the smallest gear >= n (5 frames
    on gears 1/2/4/8 run as 8); a static model always runs its full batch, the slots beyond n
    being padding."""
    capacity = min(max_batch, model_batch)
    usable = tuple(g for g in gears if g <= next(g for g in gears if g >= capacity)) if gears else ()
    sizes = usable or (model_batch,)
    return capacity, usable, [0] + [next(g for g in sizes if g >= n) for n in range(1, capacity + 1)]


def warm_up_sizes(gears: tuple[int, ...], capacity: int) -> tuple[int, ...]:
    """One batch per gear (each gear's first run loads its own kernels): the gear itself, or the
    capacity for the gear a full batch runs on; one frame for a fixed-batch model."""
    if len(gears) <= 1:
        return (1,)
    return tuple(sorted({1} | {min(g, capacity) for g in gears}))


def image_tensor(model_path: str, desc: int, model_id: int | None, index: int, dims: list[int], name: str,
                 model_batch: int) -> tuple[Tensor, bool]:
    """The image input, sized per frame from the description (which sizes the largest gear), and
    whether it takes AIPP frames (uint8 means AIPP)."""
    size = acl.mdl.get_input_size_by_index(desc, index)
    dtype = numpy_dtype(model_path, acl.mdl.get_input_data_type(desc, index), "input")
    aipp = has_static_aipp(model_path, model_id, index) or dtype == np.uint8
    if len(dims) != 4 or min(dims[1:]) < 1:
        raise ModelError(f"{model_path}: expected a 4-D image input with fixed size, got {dims}")
    if size % model_batch:
        raise ModelError(f"{model_path}: input size {size} is not a multiple of the batch {model_batch}")
    item_bytes = size // model_batch
    shape: tuple[int, ...]
    if aipp:
        h, w, ch = aipp_shape(model_path, desc, dims, index, item_bytes)
        dtype, shape = np.dtype(np.uint8), ((h, w, ch) if ch else (h * 3 // 2, w))  # NV12: one 2-D plane
    else:
        shape = tuple(dims[1:])
        if math.prod(shape) * dtype.itemsize != item_bytes:
            raise ModelError(f"{model_path}: input dims {dims} of {dtype} do not fill its {size} bytes")
    return Tensor(name, dtype, shape, item_bytes, size, index), aipp


def output_tensor(model_path: str, desc: int, index: int, model_batch: int) -> Tensor:
    """Shape and type per frame from the description: raw feature maps come out as they are, for
    the `raw` decoder. The device buffer holds the largest gear whatever the description says its
    size is (that value is not confirmed for dynamic-batch models)."""
    dims, name = tensor_dims(acl.mdl.get_output_dims(desc, index), "acl.mdl.get_output_dims", f"output{index}")
    dtype = numpy_dtype(model_path, acl.mdl.get_output_data_type(desc, index), f"output {index}")
    size = acl.mdl.get_output_size_by_index(desc, index)
    shape = tuple(dims[1:])
    if not shape or min(shape) < 1:
        raise ModelError(f"{model_path}: output {index} has dims {dims}; outputs with dynamic "
                         f"shapes are not supported")
    item_bytes = math.prod(shape) * dtype.itemsize
    if size < item_bytes * model_batch:
        log.debug("%s: output %d is described as %d bytes, %d needed for batch %d", model_path,
                  index, size, item_bytes * model_batch, model_batch)
    return Tensor(name, dtype, shape, item_bytes, max(size, item_bytes * model_batch), index)


def tensor_dims(result, call: str, default_name: str) -> tuple[list[int], str]:
    """`get_input_dims` / `get_output_dims` answer {"name", "dimCount", "dims"}."""
    info = checked(result, call)
    dims = [int(d) for d in info["dims"][:info.get("dimCount", len(info["dims"]))]]
    return dims, str(info.get("name") or default_name)


def has_static_aipp(model_path: str, model_id: int | None, index: int) -> bool:
    """What the model says about AIPP on this input; dynamic AIPP is refused."""
    if not hasattr(acl.mdl, "get_aipp_type"):
        return False
    kind, _attached, ret = acl.mdl.get_aipp_type(model_id, index)
    if ret != rt.ACL_SUCCESS:
        name, meaning = rt.describe_code(ret)
        log.debug("acl.mdl.get_aipp_type returned %s (%s: %s); deciding AIPP from the input type",
                  ret, name, meaning)
        return False
    if kind in (rt.ACL_DATA_WITH_DYNAMIC_AIPP, rt.ACL_DYNAMIC_AIPP_NODE):
        raise ModelError(f"{model_path}: dynamic AIPP is not supported; convert with a static "
                         f"AIPP block (aipp_mode: static, input_format: RGB888_U8)")
    return kind == rt.ACL_DATA_WITH_STATIC_AIPP


def aipp_shape(model_path: str, desc: int, dims: list[int], index: int, item_bytes: int) -> tuple[int, int, int]:
    """(H, W, C) of the uint8 frame AIPP takes; C is 0 for YUV420SP (NV12: H*W*3/2 bytes, what
    the card's DVPP decodes and letterboxes, `decoder: dvpp`). The dims are read by where the
    channel count sits (ATC reports AIPP inputs NHWC, but the format may still say the
    --input_format the model was converted with); the format only settles dims like 3x3x3. NV12
    is told by the input's size (UNCONFIRMED: the dims ATC reports for a YUV420SP block; the size
    is documented as n*h*w*1.5)."""
    a, b, c = dims[1:]
    if c in (1, 3) and a not in (1, 3):
        nchw = False
    elif a in (1, 3) and c not in (1, 3):
        nchw = True
    else:
        fmt = acl.mdl.get_input_format(desc, index) if hasattr(acl.mdl, "get_input_format") else None
        nchw = fmt == rt.ACL_FORMAT_NCHW
    h, w, ch = (b, c, a) if nchw else (a, b, c)
    if ch in (1, 3) and h % 2 == 0 and h * w * 3 // 2 == item_bytes and h * w * ch != item_bytes:
        return h, w, 0
    if h * w * ch != item_bytes:
        raise ModelError(f"{model_path}: the AIPP input takes {item_bytes} bytes per frame, not a "
                         f"{w}x{h}x{ch} RGB888_U8 image (or {w}x{h} YUV420SP; other AIPP input formats "
                         f"are not supported: convert with input_format: RGB888_U8 or YUV420SP_U8)")
    return h, w, ch


def numpy_dtype(model_path: str, code: int, what: str) -> np.dtype:
    if code not in rt.ACL_DTYPES:
        raise ModelError(f"{model_path}: {what} has unsupported aclDataType {code}")
    return rt.ACL_DTYPES[code]

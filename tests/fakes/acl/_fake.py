"""State and test controls of the fake pyACL (not part of the real `acl` API: tests import it as
`acl._fake`). The public modules `acl`, `acl.rt`, `acl.mdl`, `acl.media`, `acl.util` only call into here.

Test controls:
* `reset(devices=2, run_mode=ACL_HOST, util_helpers=ALL_UTIL, soc="Ascend310P3", vdec_channels=32)`:
  a fresh process (pyACL allows one `acl.init` per process, so every in-process test starts with
  one); `vdec_channels` caps the VDEC channels one card runs at once (UNCONFIRMED for the 310P);
  `STATE.media.wait_bound_s` (default 10) bounds the waits that would hang forever on a card
  (stop_thread on a thread that never returns, vdec_destroy_channel without a report thread,
  process_report(-1));
* `fail(call, code, device=None, times=None)`: the next `times` calls of `call` on `device` (None:
  any) return `code` instead of running; calls that take faults: "acl.rt.set_device",
  "acl.rt.malloc", "acl.rt.malloc_host", "acl.mdl.execute", "acl.mdl.execute_async",
  "acl.media.dvpp_malloc";
* `hold(call, device=None, times=1)`: the next `times` calls of `call` on `device` block (a hung
  card) until the returned `Hold` is released, then run as usual; they wait outside the fake's
  lock, so the other cards go on. Only calls that name a device or a model take holds
  ("acl.mdl.execute", "acl.mdl.execute_async", "acl.rt.set_device"); `Hold.entered` is set when
  a call is held;
* `STATE.counts`: calls per function name; `STATE.errors`: every non-zero code returned, with the
  call; `STATE.refusals`: the same with the fake's reason (what the report calls misuse);
  `STATE.executed_gears`: the batch gear of every execution (`STATE.executed_models`: the model
  id of each); `leaks()`: what is still held (also dvpp memory and every acl.media description,
  config and channel); `allocated(kind, device)`: bytes asked for in live allocations ("device":
  acl.rt.malloc, "dvpp": acl.media.dvpp_malloc, "host": acl.rt.malloc_host), before the rounding;
* `report()["media"]`: {"devices": {"<id>": {jpegd, vpc, vdec_frames, vdec_errors, vdec_callbacks,
  vdec_channels_created/destroyed, dvpp_channels_created/destroyed, dvpp_mallocs,
  dvpp_live_allocations, dvpp_live_bytes}}, "threads_running"} (keys appear once non-zero);
* `report()` / `write_report()`: a JSON summary, written to $YOLOEDGE_FAKE_ACL_REPORT at every
  `acl.finalize` and at interpreter exit (a daemon that leaves through os._exit writes it at its
  finalize, which is what the tests check).
Environment (for subprocess daemons): YOLOEDGE_FAKE_ACL_DEVICES (default 2),
YOLOEDGE_FAKE_ACL_REPORT (report path).
"""

from __future__ import annotations

import atexit
import bisect
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, Callable

import numpy as np

# -- codes and constants (the real values; see yoloedge/backends/acl_runtime.py) -----------------
SUCCESS = 0
INVALID_PARAM = 100000
UNINITIALIZE = 100001
REPEAT_INITIALIZE = 100002
INVALID_FILE = 100003
INVALID_MODEL_ID = 100011
DESERIALIZE_MODEL = 100012
MODEL_INPUT_NOT_MATCH = 100017
MODEL_OUTPUT_NOT_MATCH = 100018
MODEL_NOT_DYNAMIC = 100019
REPEAT_FINALIZE = 100037
RT_PARAM_INVALID = 107000
RT_INVALID_DEVICEID = 107001
RT_CONTEXT_NULL = 107002
RT_STREAM_CONTEXT = 107003
RT_MODEL_CONTEXT = 107004
GE_DATA_SIZE_INVALID = 145006
GE_ADDR_INVALID = 145007
GE_DYNAMIC_INPUT_ADDR_INVALID = 145011
GE_DYNAMIC_INPUT_LENGTH_INVALID = 145012
GE_DYNAMIC_BATCH_SIZE_INVALID = 145013
GE_AIPP_NOT_EXIST = 145015
RT_THREAD_SUBSCRIBE = 107012  # process_report on a thread no channel/stream is subscribed to
RT_REPORT_TIMEOUT = 507012  # process_report saw no report within its timeout
RT_FEATURE_NOT_SUPPORT = 207000
RT_MEMORY_ALLOCATION = 207001
FAILURE = 500001

MEMCPY_HOST_TO_HOST, MEMCPY_HOST_TO_DEVICE, MEMCPY_DEVICE_TO_HOST, MEMCPY_DEVICE_TO_DEVICE = 0, 1, 2, 3
ACL_DEVICE, ACL_HOST = 0, 1
ALL_UTIL = ("bytes_to_ptr", "ptr_to_bytes", "numpy_to_ptr", "ptr_to_numpy")
DEVICE_MEMORY = 8 << 30  # per fake card
MBATCH_NAME = "ascend_mbatch_shape_data"


class Refused(Exception):
    """Raised inside the fake to return `code` from the public function."""

    def __init__(self, code: int, why: str = ""):
        super().__init__(why)
        self.code = code


# -- memory --------------------------------------------------------------------------------------
@dataclass
class Region:
    """Real bytes behind a pointer: the pointer is the numpy buffer's own address."""

    ptr: int
    size: int
    kind: str  # "device" | "dvpp" (acl.media.dvpp_malloc) | "host" (pinned) | "pageable" (bytes_to_ptr)
    device: int | None
    data: np.ndarray | None  # uint8; None for read-only `bytes`
    owner: Any = None  # keeps a borrowed object alive
    on_device: bool = False  # device-side memory that is not kind "device": dvpp, or malloc_host in ACL_DEVICE
    requested: int = 0  # the size asked for (malloc rounds it up)
    model: int | None = None  # the model whose dataset first used this memory (fake-only strictness)

    def view(self, ptr: int, count: int) -> np.ndarray:
        offset = ptr - self.ptr
        if self.data is not None:
            return self.data[offset:offset + count]
        return np.frombuffer(self.owner, np.uint8)[offset:offset + count]


@dataclass
class Context:
    device: int
    default: bool


@dataclass
class Stream:
    context: int
    pending: list = field(default_factory=list)


@dataclass
class Model:
    model_id: int
    context: int
    device: int
    spec: "ModelSpec"


@dataclass
class Tensor:
    name: str
    dtype_code: int
    fmt: int
    dims: list  # as get_*_dims reports them
    size: int  # bytes for the largest gear
    item_bytes: int
    item_shape: tuple


@dataclass
class ModelSpec:
    """What the fake .om is: the paired ONNX file and how the conversion was configured."""

    onnx: str
    gears: tuple  # () for a static batch
    batch: int  # static batch, or the largest gear
    aipp: bool
    inputs: list  # Tensor; the mbatch input last when dynamic
    outputs: list  # Tensor
    onnx_input: str
    onnx_input_dtype: np.dtype
    onnx_batch_fixed: bool  # True: the ONNX takes one image at a time
    onnx_outputs: list  # names in the order of `outputs`
    aipp_format: str = ""  # "" (no AIPP), "rgb" (RGB888_U8) or "yuv420sp" (YUV420SP_U8, NV12 in)


@dataclass
class MediaState:
    """What acl.media and the report threads hold (the objects themselves live in media.py/util.py)."""

    vdec_cap: int  # VDEC channels one card runs at once
    lock: Any = None
    channel_descs: dict = field(default_factory=dict)  # dvpp channel desc -> media.DvppChannel
    pic_descs: dict = field(default_factory=dict)  # -> media.PicDesc
    stream_descs: dict = field(default_factory=dict)  # -> media.StreamDesc
    roi_configs: dict = field(default_factory=dict)  # -> (left, right, top, bottom)
    resize_configs: dict = field(default_factory=dict)  # -> interpolation
    vdec_descs: dict = field(default_factory=dict)  # -> media.VdecChannel
    frame_configs: set = field(default_factory=set)
    threads: dict = field(default_factory=dict)  # thread id -> util.ReportThread
    subscriptions: dict = field(default_factory=dict)  # stream -> thread id (acl.rt.subscribe_report)
    reports: dict = field(default_factory=dict)  # thread id -> list of pending callbacks
    counters: Counter = field(default_factory=Counter)  # (device, what) -> count
    cond: Any = None  # signalled when a report is queued or delivered
    wait_bound_s: float = 10.0  # where the real call would wait forever (join, destroy), the fake gives up

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)

    def count(self, device: int, what: str, n: int = 1) -> None:
        self.counters[(device, what)] += n

    def leaks(self) -> dict:
        return {
            "dvpp_channel_descs": len(self.channel_descs),
            "dvpp_channels": sum(1 for c in self.channel_descs.values() if c.created),
            "pic_descs": len(self.pic_descs),
            "stream_descs": len(self.stream_descs),
            "roi_configs": len(self.roi_configs),
            "resize_configs": len(self.resize_configs),
            "vdec_channel_descs": len(self.vdec_descs),
            "vdec_channels": sum(1 for c in self.vdec_descs.values() if c.created),
            "vdec_frame_configs": len(self.frame_configs),
        }

    def report(self, state: "State") -> dict:
        """Per device: what DVPP did, and the DVPP memory still held."""
        per: dict[str, dict] = {}
        for (device, what), n in sorted(self.counters.items()):
            per.setdefault(str(device), {})[what] = n
        for region in state.regions.values():
            if region.kind == "dvpp":
                entry = per.setdefault(str(region.device), {})
                entry["dvpp_live_allocations"] = entry.get("dvpp_live_allocations", 0) + 1
                entry["dvpp_live_bytes"] = entry.get("dvpp_live_bytes", 0) + region.requested
        return {"devices": per, "threads_running": sum(1 for t in self.threads.values() if t.alive())}


@dataclass
class Hold:
    """A hang injected with `hold()`: calls wait until `release()`."""

    call: str
    device: int | None
    times: int | None
    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)
    held: int = 0  # calls caught so far

    def release(self) -> None:
        self.released.set()


class State:
    def __init__(self, devices: int = 2, run_mode: int = ACL_HOST, soc: str = "Ascend310P3",
                 vdec_channels: int = 32):
        self.lock = threading.RLock()
        self.local = threading.local()
        self.devices = devices
        self.run_mode = run_mode
        self.soc = soc
        self.initialised = False
        self.init_count = 0
        self.finalize_count = 0
        self.finalize_refused: list[dict] = []
        self.device_refs: Counter = Counter()
        self.default_context: dict[int, int] = {}
        self.contexts: dict[int, Context] = {}
        self.streams: dict[int, Stream] = {}
        self.regions: dict[int, Region] = {}
        self._starts: list[int] = []
        self.borrowed: list[Region] = []
        self.device_used: Counter = Counter()
        self.models: dict[int, Model] = {}
        self.descs: dict[int, int | None] = {}  # desc -> model id (after get_desc)
        self.datasets: dict[int, list[int]] = {}
        self.data_buffers: dict[int, tuple[int, int]] = {}
        self.counts: Counter = Counter()
        self.errors: list[tuple[str, int]] = []
        self.refusals: list[tuple[str, int, str]] = []
        self.dataset_model: dict[int, int] = {}  # dataset -> the model it was first executed with
        self.executed_models: list[int] = []
        self.faults: list[dict] = []
        self.holds: list[Hold] = []
        self.executed_gears: list[int] = []
        self.last_gear: dict[int, int] = {}
        self.media = MediaState(vdec_channels, self.lock)
        self._next_handle = 0x1000

    def handle(self) -> int:
        self._next_handle += 0x10
        return self._next_handle

    # -- threads and contexts --------------------------------------------------------------------
    def current_context(self) -> int:
        ctx = getattr(self.local, "context", 0)
        if ctx not in self.contexts:
            raise Refused(RT_CONTEXT_NULL, "no current context on this thread")
        return ctx

    def bind(self, ctx: int) -> None:
        self.local.context = ctx

    # -- memory ----------------------------------------------------------------------------------
    def add_region(self, size: int, kind: str, device: int | None, requested: int = 0, align: int = 0) -> Region:
        """Real zeroed bytes; `align` > 0: the pointer is a multiple of it (DVPP wants 128)."""
        raw = np.zeros(size + align, np.uint8)
        skip = (-raw.ctypes.data) % align if align else 0
        data = raw[skip:skip + size]
        region = Region(data.ctypes.data, size, kind, device, data, owner=raw, requested=requested or size)
        self._insert(region)
        return region

    def borrow(self, obj: Any, ptr: int, size: int, data: np.ndarray | None) -> Region:
        """Host memory yoloedge owns (bytes_to_ptr / numpy_to_ptr); kept alive while registered."""
        for old in [r for r in self.borrowed if r.ptr == ptr]:
            self._remove(old)
            self.borrowed.remove(old)
        region = Region(ptr, size, "pageable", None, data, owner=obj)
        self._insert(region)
        self.borrowed.append(region)
        while len(self.borrowed) > 256:
            self._remove(self.borrowed.pop(0))
        return region

    def _insert(self, region: Region) -> None:
        self.regions[region.ptr] = region
        bisect.insort(self._starts, region.ptr)

    def _remove(self, region: Region) -> None:
        del self.regions[region.ptr]
        self._starts.remove(region.ptr)

    def free(self, ptr: int, kind: str) -> None:
        region = self.regions.get(ptr)
        if region is None or region.kind != kind:
            raise Refused(RT_PARAM_INVALID, f"free of unknown or already freed {kind} pointer {ptr:#x}")
        self._remove(region)
        if region.device is not None:
            self.device_used[region.device] -= region.size

    def find(self, ptr: int, count: int) -> Region:
        """The region holding [ptr, ptr+count); an unknown pointer or overrun is refused."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0:
            region = self.regions[self._starts[i]]
            if ptr + count <= region.ptr + region.size:
                return region
        raise Refused(RT_PARAM_INVALID, f"pointer {ptr:#x} (+{count} bytes) is not memory of this process")

    # -- faults ----------------------------------------------------------------------------------
    def fault(self, call: str, device: int | None) -> None:
        for f in self.faults:
            if f["call"] == call and f["device"] in (None, device) and f["times"] != 0:
                if f["times"] is not None:
                    f["times"] -= 1
                raise Refused(f["code"], f"injected fault on device {device}")

    def take_hold(self, call: str, device: int | None) -> Hold | None:
        """The hold that catches this call, if any (callers hold the lock)."""
        for h in self.holds:
            if h.call == call and h.device in (None, device) and h.times != 0:
                if h.times is not None:
                    h.times -= 1
                h.held += 1
                return h
        return None

    def allocated(self, kind: str, device: int | None = None) -> int:
        """Bytes asked for in live `kind` allocations ("device", "dvpp" or "host"), on `device` (None: any)."""
        return sum(r.requested for r in self.regions.values()
                   if r.kind == kind and (device is None or r.device == device or r.kind == "host"))

    # -- reporting -------------------------------------------------------------------------------
    def leaks(self) -> dict:
        own = [r for r in self.regions.values() if r.kind != "pageable"]
        return {
            "device_memory": sum(1 for r in own if r.kind == "device"),
            "dvpp_memory": sum(1 for r in own if r.kind == "dvpp"),
            "host_memory": sum(1 for r in own if r.kind == "host"),
            "models": len(self.models),
            "model_descs": len(self.descs),
            "datasets": len(self.datasets),
            "data_buffers": len(self.data_buffers),
            "streams": len(self.streams),
            "contexts": sum(1 for c in self.contexts.values() if not c.default),
            "devices_set": sum(1 for n in self.device_refs.values() if n > 0),
            **self.media.leaks(),
        }


STATE = State(devices=int(os.environ.get("YOLOEDGE_FAKE_ACL_DEVICES", "2")))


def reset(devices: int = 2, run_mode: int = ACL_HOST, util_helpers=ALL_UTIL, soc: str = "Ascend310P3",
          vdec_channels: int = 32) -> State:
    """A fresh fake process: nothing initialised, nothing allocated, counters at zero.
    `vdec_channels`: how many VDEC channels one card runs at once (UNCONFIRMED for the 310P)."""
    global STATE
    STATE = State(devices, run_mode, soc, vdec_channels)
    from . import util

    util.install(util_helpers)
    return STATE


def fail(call: str, code: int, device: int | None = None, times: int | None = None) -> None:
    STATE.faults.append({"call": call, "code": code, "device": device, "times": times})


def hold(call: str, device: int | None = None, times: int | None = 1) -> Hold:
    h = Hold(call, device, times)
    STATE.holds.append(h)
    return h


def leaks() -> dict:
    with STATE.lock:
        return STATE.leaks()


def report() -> dict:
    with STATE.lock:
        return {
            "init_count": STATE.init_count,
            "finalize_count": STATE.finalize_count,
            "finalize_refused": STATE.finalize_refused,
            "initialised": STATE.initialised,
            "calls": dict(STATE.counts),
            "errors": [list(e) for e in STATE.errors[:200]],
            "refusals": [list(r) for r in STATE.refusals[:200]],
            "contexts_created": STATE.counts["acl.rt.create_context"],
            "models_loaded": STATE.counts["acl.mdl.load_from_file"] - sum(
                1 for name, _code in STATE.errors if name == "acl.mdl.load_from_file"),
            "leaks": STATE.leaks(),
            "executed_gears": dict(Counter(STATE.executed_gears)),
            "media": STATE.media.report(STATE),
        }


def write_report() -> None:
    path = os.environ.get("YOLOEDGE_FAKE_ACL_REPORT")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(report(), f, indent=1, sort_keys=True)
        os.replace(tmp, path)


atexit.register(write_report)


# -- the decorator every public function goes through ------------------------------------------
def api(name: str, shape: str, needs_init: bool = True, default: Any = None,
        device_of: Callable[..., int | None] | None = None) -> Callable:
    """Count the call, take the lock, turn `Refused` into pyACL's return shape.

    shape: "ret" (an int), "value" ((value, ret)), "value2" ((a, b, ret)), "value3" ((a, b, c, ret)),
    "value4" ((a, b, c, d, ret))
    or "bare" (the value itself; `default` when refused, as the C API returns NULL/0).
    device_of(state, *args): the device the call acts on, for `hold()`.
    """

    def wrap(fn: Callable) -> Callable:
        @wraps(fn)
        def call(*args):
            state = STATE
            if device_of is not None and state.holds:
                with state.lock:
                    held = state.take_hold(name, device_of(state, *args))
                if held is not None:
                    held.entered.set()
                    held.released.wait()
            with state.lock:
                state.counts[name] += 1
                try:
                    if needs_init and not state.initialised:
                        raise Refused(UNINITIALIZE, "acl.init has not been called")
                    result = fn(state, *args)
                except Refused as refused:
                    state.errors.append((name, refused.code))
                    state.refusals.append((name, refused.code, str(refused)))
                    return _refusal(shape, refused.code, default)
            if shape == "ret":
                return SUCCESS if result is None else result
            if shape == "bare":
                return result
            return (*result, SUCCESS) if isinstance(result, tuple) and shape != "value" else (result, SUCCESS)

        return call

    return wrap


def record(state: State, name: str, code: int, why: str) -> int:
    """Note a refusal made outside `api` (calls that wait without the lock); returns `code`."""
    state.errors.append((name, code))
    state.refusals.append((name, code, why))
    return code


def _refusal(shape: str, code: int, default: Any) -> Any:
    if shape == "ret":
        return code
    if shape == "bare":
        return default
    fillers = {"value": 1, "value2": 2, "value3": 3, "value4": 4}[shape]
    return (*([default] * fillers), code)


def need_int(*values: Any) -> None:
    """pyACL's C wrapper accepts only Python ints for pointers, sizes and ids."""
    for v in values:
        if not isinstance(v, int):
            raise TypeError(f"an integer is required (got type {type(v).__name__})")

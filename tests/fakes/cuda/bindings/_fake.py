"""State and test controls of the fake `cuda.bindings.runtime` (not part of the real API: tests
import it as `cuda.bindings._fake`). The public module `cuda.bindings.runtime` only calls into here,
and so does the fake `tensorrt` when it reads and writes device memory.

Device memory is simulated: `cudaMalloc` hands out addresses above 2**47 (never a valid user-space
host address on x86-64 or arm64, so a backend that touches one from the host crashes as it would on
a discrete GPU), each backed by a bytearray the fake keeps. Pinned host memory (`cudaMallocHost`) is
real host memory (a ctypes buffer whose address is returned), so numpy can wrap it. Any other
address is pageable host memory, read and written through ctypes at the caller's risk, as CUDA does.

Test controls:
* `reset(devices=2, native_handle=True)`: a fresh process; `native_handle=False` is a cuda-python
  before 12.9.1 (no `cuda.bindings.utils.get_cuda_native_handle`; `int(handle)` is the only way and
  does not warn);
* `fail(call, code, times=1)`: the next `times` calls of `call` (e.g. "cudaMemcpyAsync") return `code`;
* `STATE.counts`: calls per function; `STATE.errors`: every non-success returned, with the call;
  `STATE.allocated(kind, device)`: bytes in live "device" or "pinned" allocations;
  `STATE.pageable_async`: async copies that touched pageable (non-pinned) host memory;
  `STATE.default_stream_ops`: work queued on the legacy default stream (0); `leaks()`: what is still held;
* `report()` / `write_report()`: a JSON summary, written to $YOLOEDGE_FAKE_CUDA_REPORT at interpreter exit.
Environment (for subprocess daemons): YOLOEDGE_FAKE_CUDA_DEVICES (default 2), YOLOEDGE_FAKE_CUDA_REPORT.
"""

from __future__ import annotations

import atexit
import bisect
import ctypes
import json
import os
import threading
from collections import Counter
from dataclasses import dataclass, field
from functools import wraps
from typing import Any, Callable

# cudaError_t values (driver_types.h; the enum of cuda.bindings.runtime has the same numbers)
SUCCESS = 0
INVALID_VALUE = 1
MEMORY_ALLOCATION = 2
INVALID_DEVICE_POINTER = 17
INVALID_MEMCPY_DIRECTION = 21
INVALID_DEVICE = 101
INVALID_RESOURCE_HANDLE = 400
ILLEGAL_ADDRESS = 700

HOST_TO_HOST, HOST_TO_DEVICE, DEVICE_TO_HOST, DEVICE_TO_DEVICE, DEFAULT = 0, 1, 2, 3, 4
DEVICE_BASE = 0x9000_0000_0000  # above 2**47: not a user-space host address
DEVICE_MEMORY = 8 << 30  # per fake GPU
ALIGNMENT = 256  # cudaMalloc returns 256-byte aligned pointers


class Refused(Exception):
    """Raised inside the fake to return `code` from the public function."""

    def __init__(self, code: int, why: str = ""):
        super().__init__(why)
        self.code = code


@dataclass
class Region:
    ptr: int
    size: int
    kind: str  # "device" | "pinned"
    device: int | None
    data: Any  # bytearray (device) or a ctypes array (pinned, real host memory)

    def contains(self, ptr: int, count: int) -> bool:
        return self.ptr <= ptr and ptr + count <= self.ptr + self.size


@dataclass
class Stream:
    handle: int
    device: int
    pending: list = field(default_factory=list)  # callables run at synchronisation, in order


class State:
    def __init__(self, devices: int = 2, native_handle: bool = True):
        self.lock = threading.RLock()
        self.local = threading.local()
        self.devices = devices
        self.native_handle = native_handle
        self.regions: dict[int, Region] = {}
        self._starts: list[int] = []
        self.freed: list[Region] = []  # pinned buffers stay alive so a use after free reads garbage, not a crash
        self.streams: dict[int, Stream] = {}
        self.next_device_ptr = DEVICE_BASE
        self.next_stream = 0x5000
        self.device_used: Counter = Counter()
        self.counts: Counter = Counter()
        self.errors: list[tuple[str, int]] = []
        self.faults: list[dict] = []
        self.pageable_async = 0
        self.default_stream_ops = 0

    # -- current device (per thread; CUDA's default is device 0) -----------------------------------
    def current_device(self) -> int:
        return getattr(self.local, "device", 0)

    # -- memory -----------------------------------------------------------------------------------
    def insert(self, region: Region) -> None:
        self.regions[region.ptr] = region
        bisect.insort(self._starts, region.ptr)

    def remove(self, region: Region) -> None:
        del self.regions[region.ptr]
        self._starts.remove(region.ptr)

    def region_at(self, ptr: int, count: int) -> Region | None:
        """The live allocation holding [ptr, ptr+count), or None (pageable host memory, or garbage)."""
        i = bisect.bisect_right(self._starts, ptr) - 1
        if i >= 0:
            region = self.regions[self._starts[i]]
            if region.contains(ptr, max(count, 1)):
                return region
        return None

    def device_region(self, ptr: int, count: int, device: int | None = None) -> Region:
        """The device allocation holding [ptr, ptr+count); refused when there is none (never
        allocated, freed, or too small), or it lives on another GPU than `device`."""
        region = self.region_at(ptr, count)
        if region is None or region.kind != "device":
            if ptr >= DEVICE_BASE:
                raise Refused(INVALID_VALUE, f"{ptr:#x} (+{count} bytes) is not inside a live device allocation")
            raise Refused(INVALID_VALUE, f"{ptr:#x} is host memory, not device memory")
        if device is not None and region.device != device:
            raise Refused(INVALID_VALUE, f"{ptr:#x} is memory of GPU {region.device}, not of GPU {device}")
        return region

    def is_device_address(self, ptr: int) -> bool:
        return ptr >= DEVICE_BASE

    def read(self, ptr: int, count: int) -> bytes:
        """Bytes at `ptr`: device memory from its bytearray, host memory through ctypes."""
        if self.is_device_address(ptr):
            region = self.device_region(ptr, count)
            offset = ptr - region.ptr
            return bytes(region.data[offset:offset + count])
        return ctypes.string_at(ptr, count)

    def write(self, ptr: int, data: bytes) -> None:
        if self.is_device_address(ptr):
            region = self.device_region(ptr, len(data))
            offset = ptr - region.ptr
            region.data[offset:offset + len(data)] = data
        else:
            ctypes.memmove(ptr, data, len(data))

    # -- streams ----------------------------------------------------------------------------------
    def stream(self, handle: int) -> Stream | None:
        """The stream behind a handle; None for the legacy default stream (0)."""
        if handle == 0:
            return None
        stream = self.streams.get(handle)
        if stream is None:
            raise Refused(INVALID_RESOURCE_HANDLE, f"unknown or destroyed stream {handle:#x}")
        return stream

    def enqueue(self, handle: int, task: Callable[[], None]) -> None:
        """Work on a stream runs at its synchronisation; on the default stream (0) it runs now,
        after every other stream's work (the legacy default stream waits for blocking streams)."""
        stream = self.stream(handle)
        if stream is None:
            self.default_stream_ops += 1
            self.drain_all()
            task()
        else:
            stream.pending.append(task)

    def drain(self, stream: Stream) -> None:
        while stream.pending:
            stream.pending.pop(0)()

    def drain_all(self) -> None:
        for stream in list(self.streams.values()):
            self.drain(stream)

    # -- faults and reports -----------------------------------------------------------------------
    def fault(self, call: str) -> None:
        for f in self.faults:
            if f["call"] == call and f["times"] != 0:
                f["times"] -= 1
                raise Refused(f["code"], "injected fault")

    def allocated(self, kind: str, device: int | None = None) -> int:
        """Bytes in live `kind` allocations ("device": cudaMalloc, "pinned": cudaMallocHost), on
        `device` (None: any; pinned memory belongs to no GPU)."""
        return sum(r.size for r in self.regions.values()
                   if r.kind == kind and (device is None or kind == "pinned" or r.device == device))

    def leaks(self) -> dict:
        return {
            "device_memory": sum(1 for r in self.regions.values() if r.kind == "device"),
            "pinned_memory": sum(1 for r in self.regions.values() if r.kind == "pinned"),
            "streams": len(self.streams),
        }


STATE = State(devices=int(os.environ.get("YOLOEDGE_FAKE_CUDA_DEVICES", "2")))


def reset(devices: int = 2, native_handle: bool = True) -> State:
    """A fresh process: nothing allocated, counters at zero."""
    global STATE
    STATE = State(devices, native_handle)
    from . import utils

    utils.install(native_handle)
    return STATE


def fail(call: str, code: int, times: int = 1) -> None:
    STATE.faults.append({"call": call, "code": code, "times": times})


def leaks() -> dict:
    with STATE.lock:
        return STATE.leaks()


def report() -> dict:
    with STATE.lock:
        return {"calls": dict(STATE.counts), "errors": [list(e) for e in STATE.errors[:200]],
                "leaks": STATE.leaks(), "pageable_async": STATE.pageable_async,
                "default_stream_ops": STATE.default_stream_ops}


def write_report() -> None:
    path = os.environ.get("YOLOEDGE_FAKE_CUDA_REPORT")
    if path:
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(report(), f, indent=1, sort_keys=True)
        os.replace(tmp, path)


atexit.register(write_report)


def api(name: str, values: int = 0) -> Callable:
    """Count the call, take the lock, and return cuda-python's shape: `(cudaError_t, *values)`,
    the value slots None on failure."""

    def wrap(fn: Callable) -> Callable:
        @wraps(fn)
        def call(*args):
            from .runtime import cudaError_t

            state = STATE
            with state.lock:
                state.counts[name] += 1
                try:
                    state.fault(name)
                    result = fn(state, *args)
                except Refused as refused:
                    state.errors.append((name, refused.code))
                    return (cudaError_t(refused.code), *([None] * values))
            if values == 0:
                return (cudaError_t.cudaSuccess,)
            if values == 1:
                return (cudaError_t.cudaSuccess, result)
            return (cudaError_t.cudaSuccess, *result)

        return call

    return wrap


def pointer(value: Any) -> int:
    """cuda-python takes pointers as ints (or objects with an address); a float or str is a TypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Argument is not an integer pointer: {type(value).__name__}")
    return value

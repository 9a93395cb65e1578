"""Fake `cuda.bindings.runtime` (cuda-python >= 12.6.1; the old `cuda.cudart` name is gone in 13).

Real behaviours modelled (API fact sheet section 3.1, GPU facts "cuda-python"):
* every call returns a tuple whose first element is a `cudaError_t` (an IntEnum, cudaSuccess == 0);
  results follow, None in their slots on failure;
* argument order of the copies is dst, src, count, kind[, stream]; `cudaMemcpyKind` has
  HostToHost 0, HostToDevice 1, DeviceToHost 2, DeviceToDevice 3, Default 4; a kind that does not
  match the pointers (a host destination for HostToDevice, ...) is cudaErrorInvalidValue, a kind
  outside 0..4 cudaErrorInvalidMemcpyDirection; an address inside no live allocation (never
  allocated, freed, or the range overruns it) is cudaErrorInvalidValue;
* the current device is per thread (0 until cudaSetDevice); cudaMalloc allocates on it;
  a device index past the fake's GPUs is cudaErrorInvalidDevice;
* cudaFree / cudaFreeHost of an unknown or already freed pointer: cudaErrorInvalidValue; cudaFree(0)
  succeeds; memory is counted per GPU (cudaMemGetInfo) and 8 GiB per fake GPU;
* streams order their work: cudaMemcpyAsync and TensorRT's execute_async_v3 queue it, and it runs
  at cudaStreamSynchronize (or cudaStreamDestroy, which completes what is queued first). Reading a
  host output before synchronising reads what was there before: a backend that forgets to
  synchronise gets stale results, as on a GPU. The legacy default stream (0) runs its work at
  once, after every other stream's, and the fake counts every use of it. cudaMemcpy (synchronous)
  completes all queued work first;
* `cudaStream_t` converts with `int()` (`getPtr()` is the address where the handle is kept, not the
  handle); from cuda-python 12.9.1 that is deprecated in favour of
  `cuda.bindings.utils.get_cuda_native_handle` (the fake warns, DeprecationWarning).
Not modelled: events, graphs, peer access, managed memory, cudaHostAlloc flags.
"""

from __future__ import annotations

import ctypes
import enum
import warnings
from typing import Any

from . import _fake
from ._fake import (ALIGNMENT, DEFAULT, DEVICE_MEMORY, DEVICE_TO_DEVICE, DEVICE_TO_HOST, HOST_TO_DEVICE, HOST_TO_HOST,
                    INVALID_DEVICE, INVALID_MEMCPY_DIRECTION, INVALID_VALUE, MEMORY_ALLOCATION, Refused, Region,
                    Stream, api, pointer)


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInitializationError = 3
    cudaErrorInvalidDevicePointer = 17
    cudaErrorInvalidMemcpyDirection = 21
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalAddress = 700
    cudaErrorLaunchFailure = 719


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = HOST_TO_HOST
    cudaMemcpyHostToDevice = HOST_TO_DEVICE
    cudaMemcpyDeviceToHost = DEVICE_TO_HOST
    cudaMemcpyDeviceToDevice = DEVICE_TO_DEVICE
    cudaMemcpyDefault = DEFAULT


class cudaStream_t:
    """A stream handle object, as cuda-python returns them. `getPtr()` is the address of the
    handle (a pointer to the pointer, as in cuda-python), never the handle itself: passed to
    TensorRT as a stream it names no stream."""

    def __init__(self, init_value: int = 0):
        self._handle = int(init_value)
        self._pvt = ctypes.c_void_p(self._handle or None)  # where the handle is stored

    def getPtr(self) -> int:
        return ctypes.addressof(self._pvt)

    def __int__(self) -> int:
        if _fake.STATE.native_handle:
            warnings.warn("int(cudaStream_t) is deprecated: use cuda.bindings.utils.get_cuda_native_handle",
                          DeprecationWarning, stacklevel=2)
        return self._handle

    def __eq__(self, other: object) -> bool:
        return isinstance(other, cudaStream_t) and other._handle == self._handle

    def __hash__(self) -> int:
        return hash(self._handle)

    def __repr__(self) -> str:
        return f"<cudaStream_t {self._handle:#x}>"


def _stream_handle(stream: Any) -> int:
    if isinstance(stream, cudaStream_t):
        return stream._handle
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    raise TypeError(f"Argument 'stream' is not instance of type (expected int or cudaStream_t, found "
                    f"{type(stream).__name__})")


def _device(state, device: Any) -> int:
    if not isinstance(device, int) or isinstance(device, bool):
        raise TypeError(f"an integer is required (got type {type(device).__name__})")
    if not 0 <= device < state.devices:
        raise Refused(INVALID_DEVICE, f"no GPU {device} (this fake has {state.devices})")
    return device


# -- devices ---------------------------------------------------------------------------------------
@api("cudaGetDeviceCount", values=1)
def cudaGetDeviceCount(state):
    return state.devices


@api("cudaSetDevice")
def cudaSetDevice(state, device):
    state.local.device = _device(state, device)


@api("cudaGetDevice", values=1)
def cudaGetDevice(state):
    return state.current_device()


@api("cudaDeviceSynchronize")
def cudaDeviceSynchronize(state):
    for stream in list(state.streams.values()):
        if stream.device == state.current_device():
            state.drain(stream)


@api("cudaMemGetInfo", values=2)
def cudaMemGetInfo(state):
    device = state.current_device()
    return DEVICE_MEMORY - state.device_used[device], DEVICE_MEMORY


# -- memory ----------------------------------------------------------------------------------------
def _size(size: Any) -> int:
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise TypeError(f"size must be a non-negative int, got {size!r}")
    return size


@api("cudaMalloc", values=1)
def cudaMalloc(state, size):
    size = _size(size)
    if size == 0:
        return 0
    device = state.current_device()
    if state.device_used[device] + size > DEVICE_MEMORY:
        raise Refused(MEMORY_ALLOCATION, f"GPU {device} is out of memory")
    ptr = state.next_device_ptr
    state.next_device_ptr += -(-size // ALIGNMENT) * ALIGNMENT + ALIGNMENT  # a gap: overruns are caught
    state.insert(Region(ptr, size, "device", device, bytearray(size)))
    state.device_used[device] += size
    return ptr


@api("cudaMallocHost", values=1)
def cudaMallocHost(state, size):
    size = _size(size)
    if size == 0:
        return 0
    buffer = (ctypes.c_ubyte * size)()  # real, zeroed host memory that numpy can wrap
    ptr = ctypes.addressof(buffer)
    state.insert(Region(ptr, size, "pinned", None, buffer))
    return ptr


@api("cudaFree")
def cudaFree(state, ptr):
    ptr = pointer(ptr)
    if ptr == 0:
        return
    region = state.regions.get(ptr)
    if region is None or region.kind != "device":
        raise Refused(INVALID_VALUE, f"cudaFree of {ptr:#x}: not a live device allocation (double free?)")
    state.drain_all()  # cudaFree synchronises the device
    state.remove(region)
    state.device_used[region.device] -= region.size


@api("cudaFreeHost")
def cudaFreeHost(state, ptr):
    ptr = pointer(ptr)
    region = state.regions.get(ptr)
    if region is None or region.kind != "pinned":
        raise Refused(INVALID_VALUE, f"cudaFreeHost of {ptr:#x}: not a live pinned allocation (double free?)")
    state.drain_all()
    state.remove(region)
    ctypes.memset(region.data, 0xA5, region.size)  # poisoned: a use after free reads garbage
    state.freed.append(region)


def _check_copy(state, dst: int, src: int, count: int, kind: int) -> bool:
    """Refuse what CUDA refuses; returns whether the copy touches host memory that is not pinned."""
    if not isinstance(kind, int) or not 0 <= kind <= DEFAULT:
        raise Refused(INVALID_MEMCPY_DIRECTION, f"no cudaMemcpyKind {kind!r}")
    dst_device, src_device = state.is_device_address(dst), state.is_device_address(src)
    wanted = {HOST_TO_HOST: (False, False), HOST_TO_DEVICE: (True, False), DEVICE_TO_HOST: (False, True),
              DEVICE_TO_DEVICE: (True, True)}.get(kind)
    if wanted is not None and wanted != (dst_device, src_device):
        name = cudaMemcpyKind(kind).name
        raise Refused(INVALID_VALUE, f"{name} from {'device' if src_device else 'host'} memory to "
                                     f"{'device' if dst_device else 'host'} memory")
    pageable = []
    for ptr, on_device in ((dst, dst_device), (src, src_device)):
        if on_device:
            state.device_region(ptr, count)
        else:
            if ptr == 0:
                raise Refused(INVALID_VALUE, "a NULL host pointer")
            region = state.region_at(ptr, 1)
            if region is not None and not region.contains(ptr, count):
                raise Refused(INVALID_VALUE, f"{count} bytes overrun the pinned buffer at {region.ptr:#x}")
            pageable.append(region is None)
    return any(pageable)


def _copier(state, dst: int, src: int, count: int):
    def copy() -> None:
        state.write(dst, state.read(src, count))
    return copy


@api("cudaMemcpy")
def cudaMemcpy(state, dst, src, count, kind):
    dst, src, count = pointer(dst), pointer(src), _size(count)
    if count == 0:
        return
    _check_copy(state, dst, src, count, kind)
    state.drain_all()  # a synchronous copy on the legacy default stream waits for the other streams
    _copier(state, dst, src, count)()


@api("cudaMemcpyAsync")
def cudaMemcpyAsync(state, dst, src, count, kind, stream):
    dst, src, count = pointer(dst), pointer(src), _size(count)
    handle = _stream_handle(stream)
    if count == 0:
        return
    state.stream(handle)  # an unknown stream is refused before anything is queued
    if _check_copy(state, dst, src, count, kind):
        state.pageable_async += 1  # CUDA stages it and the copy stops being asynchronous
    state.enqueue(handle, _copier(state, dst, src, count))


# -- streams ---------------------------------------------------------------------------------------
def _create_stream(state) -> cudaStream_t:
    state.next_stream += 0x10
    state.streams[state.next_stream] = Stream(state.next_stream, state.current_device())
    return cudaStream_t(state.next_stream)


@api("cudaStreamCreate", values=1)
def cudaStreamCreate(state):
    return _create_stream(state)


@api("cudaStreamCreateWithFlags", values=1)
def cudaStreamCreateWithFlags(state, flags):
    if not isinstance(flags, int) or flags not in (0, 1):
        raise Refused(INVALID_VALUE, f"unknown stream flags {flags!r}")
    return _create_stream(state)


@api("cudaStreamSynchronize")
def cudaStreamSynchronize(state, stream):
    handle = _stream_handle(stream)
    target = state.stream(handle)
    if target is None:
        state.drain_all()
    else:
        state.drain(target)


@api("cudaStreamDestroy")
def cudaStreamDestroy(state, stream):
    handle = _stream_handle(stream)
    if handle == 0:
        raise Refused(INVALID_VALUE, "the default stream cannot be destroyed")
    target = state.stream(handle)
    state.drain(target)  # queued work completes before the stream goes
    del state.streams[handle]
    _fake.write_report()  # the last step of a backend's teardown (a daemon may leave through os._exit)


__all__ = ["cudaError_t", "cudaMemcpyKind", "cudaStream_t", "cudaGetDeviceCount", "cudaSetDevice", "cudaGetDevice",
           "cudaDeviceSynchronize", "cudaMemGetInfo", "cudaMalloc", "cudaMallocHost", "cudaFree", "cudaFreeHost",
           "cudaMemcpy", "cudaMemcpyAsync", "cudaStreamCreate", "cudaStreamCreateWithFlags", "cudaStreamSynchronize",
           "cudaStreamDestroy"]

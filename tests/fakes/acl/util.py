"""Fake `acl.util`: pointer helpers and threads.

Which pointer helpers exist depends on the CANN release (the fact sheet: bytes_to_ptr/ptr_to_bytes
are documented from CANN 6.0.1; numpy_to_ptr/ptr_to_numpy are deprecated and warn on every call),
so `_fake.reset(util_helpers=...)` installs a chosen subset.

`start_thread(func, args) -> (thread_id, ret)` and `stop_thread(thread_id) -> ret` follow pyACL's
util/thread.cpp: the thread calls `func(args)` (`func()` when args is None) and the id is the
pthread id (here the Python thread's ident, which is the same number on Linux); `stop_thread` does
NOT stop anything, it joins (pthread_join), so the thread function must return by itself; an
exception raised in the thread is printed and then raised by stop_thread as a RuntimeError
"exception=<type>,msg=thread call failed;". Fake-only bounds: a join that would wait forever raises
RuntimeError after `STATE.media.wait_bound_s` and is recorded as misuse; an unknown id returns 3
(ESRCH, what pthread_join answers for an id it does not know; UNCONFIRMED for a stale pthread_t)."""

from __future__ import annotations

import ctypes
import sys
import threading
import traceback
import warnings

import numpy as np

from . import _fake
from ._fake import Refused, api, need_int

NPY_TYPES = {0: np.bool_, 1: np.int8, 2: np.uint8, 3: np.int16, 4: np.uint16, 5: np.int32, 6: np.uint32,
             7: np.int64, 8: np.uint64, 11: np.float32, 12: np.float64, 23: np.float16}


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(f"acl.util.{name} will be deprecated, use acl.util.{instead}", Warning, stacklevel=3)


@api("acl.util.bytes_to_ptr", "bare", needs_init=False, default=0)
def _bytes_to_ptr(state, data):
    if not isinstance(data, bytes):
        raise TypeError(f"bytes_to_ptr() argument must be bytes, not {type(data).__name__}")
    ptr = ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value or 0
    # pyACL hands out the bytes object's own buffer (writable through the pointer, as acllite uses it)
    view = np.ctypeslib.as_array((ctypes.c_ubyte * max(len(data), 1)).from_address(ptr))[:len(data)]
    state.borrow(data, ptr, len(data), view)
    return ptr


@api("acl.util.ptr_to_bytes", "bare", needs_init=False, default=b"")
def _ptr_to_bytes(state, ptr, size):
    need_int(ptr, size)
    return state.find(ptr, size).view(ptr, size).tobytes()


@api("acl.util.numpy_to_ptr", "bare", needs_init=False, default=0)
def _numpy_to_ptr(state, array):
    _deprecated("numpy_to_ptr", "bytes_to_ptr")
    if not isinstance(array, np.ndarray):
        raise TypeError("numpy_to_ptr() needs a numpy.ndarray")
    if not array.flags.c_contiguous:
        print("Warning: The input ndarray is discontiguous. Please use acl.util.numpy_contiguous_to_ptr "
              "instead.", file=sys.stderr)
    flat = array.reshape(-1).view(np.uint8) if array.flags.c_contiguous else None
    state.borrow(array, array.ctypes.data, array.nbytes, flat)
    return array.ctypes.data


@api("acl.util.ptr_to_numpy", "bare", needs_init=False, default=None)
def _ptr_to_numpy(state, ptr, shape, npy_type):
    _deprecated("ptr_to_numpy", "ptr_to_bytes")
    need_int(ptr, npy_type)
    if not isinstance(shape, tuple):
        raise TypeError("shape must be a tuple")
    if npy_type not in NPY_TYPES:
        raise Refused(_fake.INVALID_PARAM, f"npy type {npy_type}")
    dtype = np.dtype(NPY_TYPES[npy_type])
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    region = state.find(ptr, nbytes)
    return region.view(ptr, nbytes).view(dtype).reshape(shape)  # zero copy: shares the memory


class ReportThread:
    """A thread started by acl.util.start_thread (VDEC callbacks run on one, in acl.rt.process_report)."""

    def __init__(self, func, args):
        self.func, self.args = func, args
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="acl-util-thread", daemon=True)

    def _run(self) -> None:
        try:
            if self.args is None:
                self.func()
            else:
                self.func(self.args)
        except BaseException as exc:  # noqa: BLE001 -- pyACL prints it and hands it to stop_thread
            self.error = exc
            traceback.print_exc()

    def alive(self) -> bool:
        return self.thread.is_alive()


@api("acl.util.start_thread", "value", needs_init=False, default=0)
def start_thread(state, func, args):
    if not callable(func):
        raise TypeError("parameter must be callable")
    worker = ReportThread(func, args)
    worker.thread.start()
    tid = worker.thread.ident or 0
    state.media.threads[tid] = worker
    return tid


ESRCH = 3


def stop_thread(thread_id):
    """pthread_join: waits (without the fake's lock) for the thread function to return."""
    state = _fake.STATE
    need_int(thread_id)
    with state.lock:
        state.counts["acl.util.stop_thread"] += 1
        worker = state.media.threads.get(thread_id)
        if worker is None:
            return _fake.record(state, "acl.util.stop_thread", ESRCH, f"no thread {thread_id} to join")
        if worker.thread is threading.current_thread():
            return _fake.record(state, "acl.util.stop_thread", 35, "a thread joining itself (EDEADLK)")
    worker.thread.join(state.media.wait_bound_s)
    with state.lock:
        if worker.alive():
            _fake.record(state, "acl.util.stop_thread", -1,
                         "stop_thread joins: the thread function never returned (the real call waits forever)")
            raise RuntimeError(f"fake acl: stop_thread({thread_id}) would block forever; "
                               "stop_thread only joins, make the thread function return first")
        state.media.threads.pop(thread_id, None)
        if worker.error is not None:
            raise RuntimeError(f"exception={type(worker.error).__name__},msg=thread call failed;")
    return 0


_IMPLS = {"bytes_to_ptr": _bytes_to_ptr, "ptr_to_bytes": _ptr_to_bytes,
          "numpy_to_ptr": _numpy_to_ptr, "ptr_to_numpy": _ptr_to_numpy}


def install(helpers) -> None:
    """Make exactly `helpers` available as acl.util.<name>."""
    module = sys.modules[__name__]
    for name, impl in _IMPLS.items():
        if name in helpers:
            setattr(module, name, impl)
        elif hasattr(module, name):
            delattr(module, name)


install(_fake.ALL_UTIL)

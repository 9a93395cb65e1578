"""Thread priorities: the device worker first, the host pipeline around it.

On Linux every thread has its own nice value. The threads that feed and drain the device --
camera readers (decoding), preparers, post-processing -- run a few steps below the device
workers (and the threads a runtime starts from them, such as ONNX Runtime's intra-op pool, which
inherit the worker's). When the device is the CPU itself, an inference is a parallel loop that
is only as fast as its slowest thread: a decoder preempting one of its threads stalls all of
them, so the inference slows by more than the CPU time it lost. At a lower priority the host
work fills the gaps instead. When the device is a card, the worker mostly waits and the host
threads get the CPU all the same.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

#: how many nice steps the host pipeline's threads sit below the device workers
HOST_NICENESS = 5


def lower_priority(steps: int = HOST_NICENESS) -> bool:
    """Lower the calling thread's priority by `steps` nice levels (Linux; elsewhere a no-op).
    Lowering needs no privilege; failing to is harmless and logged at debug level."""
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id"):
        return False
    tid = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + steps))
    except OSError as exc:
        log.debug("cannot lower the priority of thread %s: %s", threading.current_thread().name, exc)
        return False
    return True

"""What the Ascend backend measures and checks besides running the model: the events that time a
batch's copy-in, execution and copy-out on the card, msprof profiling of the first batches
(`ascend.profile`), and the SoC an `.om` was converted for.

Kept apart from `acl_runtime` (the process, context and error codes every pyACL call needs) and
from `ascend` (the model's buffers and run) because each is optional: a sync backend creates no
events, profiling is off unless configured, and an `.om` that names no SoC is simply not checked.

pyACL facts, from its source (python/pyACL/rt/rt_synchronize.cpp, prof/prof_wrap.cpp):
`acl.rt.create_event()` -> (event, ret); `record_event(event, stream)`, `synchronize_event(event)`,
`destroy_event(event)` -> ret; `event_elapsed_time(start, end)` -> (ms as a float, ret).
"""

from __future__ import annotations

import logging
import os
import re
import threading

import acl

from ..errors import BackendError
from .acl_runtime import ACL_SUCCESS, AclError, check, checked
from .base import BatchTiming
from .undo import UndoStack, raise_collected

log = logging.getLogger(__name__)


class StepEvents:
    """Four events recorded on the stream around a batch's steps: before the copy-in, before the
    execution, before the copy-out, after it. Created once (at open), one set per output set, so
    two batches queued at once (a pipelined worker) each have their own; reused by every batch."""

    COPY_IN, EXECUTE, COPY_OUT, END = range(4)

    def __init__(self, undo: UndoStack, stream: int):
        self.stream = stream
        self.events = tuple(self._create(undo, what) for what in ("copy-in", "execute", "copy-out", "end"))

    @staticmethod
    def _create(undo: UndoStack, what: str) -> int:
        event = checked(acl.rt.create_event(), "acl.rt.create_event", f"the {what} event")
        undo.push(f"destroy the {what} event", lambda: check(acl.rt.destroy_event(event), "acl.rt.destroy_event"))
        return event

    def record(self, step: int) -> None:
        check(acl.rt.record_event(self.events[step], self.stream), "acl.rt.record_event")

    def wait(self) -> None:
        """Wait for the last event (recorded when the batch was queued): the stream runs in order,
        so every step queued before it is done (a failed step's error is returned here)."""
        check(acl.rt.synchronize_event(self.events[self.END]), "acl.rt.synchronize_event")

    def timing(self) -> BatchTiming:
        """The device's own times between the events of the batch just waited for."""
        ev = self.events
        copy_in, execute, copy_out = (checked(acl.rt.event_elapsed_time(ev[i], ev[i + 1]),
                                              "acl.rt.event_elapsed_time") / 1000.0 for i in range(3))
        return BatchTiming(copy_in, execute, copy_out, "events")


#: how far into an .om `model_soc` looks, and the SoC name it looks for after the attribute key
OM_SCAN_BYTES = 64 << 20
_SOC_ATTR = re.compile(rb"soc_version[^A-Za-z0-9]{0,16}(Ascend[0-9A-Za-z_]{1,24})")


def model_soc(path: str, limit: int = OM_SCAN_BYTES) -> str | None:
    """The --soc_version an .om was converted for, or None where it is not found.

    ATC records it among the model's attributes (`atc --mode=1 --om=x.om --json=x.json` shows a
    "soc_version" key with the chip, e.g. "Ascend310P3"); pyACL has no call that returns it. So
    this scans the first `limit` bytes of the file, in chunks, for the key followed by an Ascend
    chip name. UNCONFIRMED: where in the .om the attribute sits and how it is encoded (read as a
    serialised attribute map: key, a few framing bytes, the string); the byte scan is a heuristic.
    """
    keep = 64
    tail = b""
    try:
        with open(path, "rb") as f:
            done = 0
            while done < limit:
                chunk = f.read(min(1 << 20, limit - done))
                if not chunk:
                    return None
                done += len(chunk)
                found = _SOC_ATTR.search(tail + chunk)
                if found:
                    return found.group(1).decode("ascii")
                tail = (tail + chunk)[-keep:]
    except OSError as exc:
        log.warning("cannot read %s to find its --soc_version: %s", path, exc)
    return None


# acl_prof.h: aclprofAicoreMetrics and the data type flags of aclprofCreateConfig
ACL_AICORE_ARITHMETIC_UTILIZATION = 0
ACL_PROF_ACL_API = 0x0001
ACL_PROF_TASK_TIME = 0x0002
ACL_PROF_AICORE_METRICS = 0x0004


class Profiling:
    """msprof data of a bounded number of batches (`ascend.profile`), through acl.prof.

    pyACL (prof_wrap.cpp): `acl.prof.init(path)` -> ret; `acl.prof.create_config(device_list,
    aicore_metrics, aicore_events, data_type_config)` -> config (0 on failure; aicore_events is a
    pointer, 0 for none); `acl.prof.start(config)`, `stop(config)`, `destroy_config(config)`,
    `finalize()` -> ret. Profiling is per process (one init), so one backend profiles at a time;
    another asking while it runs is told so in the log and not profiled.
    """

    _lock = threading.Lock()
    _active: "Profiling | None" = None

    def __init__(self, directory: str, config: int, batches: int, what: str):
        self.directory, self.config, self.left, self.what = directory, config, batches, what

    @classmethod
    def start(cls, directory: str, device: int, batches: int, what: str) -> "Profiling | None":
        """Initialise and start profiling `device`; None when another backend is profiling."""
        if not hasattr(acl, "prof"):
            raise BackendError(f"{what}: ascend.profile is set but this pyACL has no acl.prof")
        with cls._lock:
            if cls._active is not None:
                log.warning("%s: not profiled: %s is being profiled (one acl.prof session per process)",
                            what, cls._active.what)
                return None
            os.makedirs(directory, exist_ok=True)
            check(acl.prof.init(directory), "acl.prof.init", directory)
            config = acl.prof.create_config([device], ACL_AICORE_ARITHMETIC_UTILIZATION, 0,
                                            ACL_PROF_ACL_API | ACL_PROF_TASK_TIME | ACL_PROF_AICORE_METRICS)
            if not config:
                check(acl.prof.finalize(), "acl.prof.finalize")
                raise BackendError("acl.prof.create_config returned no configuration")
            ret = acl.prof.start(config)
            if ret != ACL_SUCCESS:
                acl.prof.destroy_config(config)
                acl.prof.finalize()
                raise AclError("acl.prof.start", ret, directory)
            cls._active = profiling = cls(directory, config, batches, what)
        log.info("%s: profiling the next %d batches of device %d into %s", what, batches, device, directory)
        return profiling

    def batch_done(self) -> bool:
        """Count one batch; the last one stops the profiler (True: it stopped)."""
        self.left -= 1
        if self.left > 0:
            return False
        self.stop()
        return True

    def stop(self) -> None:
        """stop -> destroy_config -> finalize, once (the batch count or close, whichever first)."""
        with Profiling._lock:
            if Profiling._active is not self:
                return
            Profiling._active = None
        errors: list[Exception] = []
        for call, fn in (("acl.prof.stop", lambda: acl.prof.stop(self.config)),
                         ("acl.prof.destroy_config", lambda: acl.prof.destroy_config(self.config)),
                         ("acl.prof.finalize", acl.prof.finalize)):
            try:
                check(fn(), call)
            except AclError as exc:
                errors.append(exc)
        raise_collected(errors, f"profiling of {self.what}")
        log.info("%s: profiling stopped; the msprof data is in %s", self.what, self.directory)


def soc_problem(model_path: str, model_soc: str | None, card_soc: str, device: int) -> str | None:
    """The status problem of an .om converted for another SoC than the card's; None when it matches
    or either is unknown."""
    if not model_soc or not card_soc or model_soc == card_soc:
        return None
    return (f"{model_path} was converted for {model_soc} (--soc_version) but device {device} is "
            f"{card_soc}: convert it again with --soc_version={card_soc}")

"""The DVPP media engine of one Ascend card: VDEC channels, JPEGD and the VPC letterbox.

For `decoder: dvpp` cameras the frames never visit the host: VDEC decodes the camera's H.264 /
H.265 into NV12 pictures in DVPP memory, VPC letterboxes each picture straight into a model input
canvas on the same card (an NV12 canvas the model's YUV420SP AIPP converts), and only the boxes come
back. JPEG snapshots and MJPEG take JPEGD instead of VDEC.

`DvppCard` owns what the card's media work shares:

    open:  acl.init (through `acl_runtime.PROCESS`'s count) -> set_device -> its OWN context
           (create_context) -> a stream -> run mode -> DVPP channel (dvpp_create_channel_desc +
           dvpp_create_channel, shared by JPEGD and VPC) -> the report thread
           (acl.util.start_thread; subscribed to the card's stream with acl.rt.subscribe_report so
           that process_report is legal before the first and after the last VDEC channel; it binds
           the context and loops on acl.rt.process_report until close, running VDEC's callbacks)
    close: the VDEC channels still open (while the report thread runs: vdec_destroy_channel waits
           for their callbacks), the JPEG slots and canvases, the per-thread lanes, then exactly the
           reverse of open. Idempotent; every step runs, the first failure is raised.

Its own context, not the inference backend's: the media engine opens before any model and may
outlive a worker incarnation's reload; contexts of one device share its memory, so a picture or
canvas in DVPP memory is usable by a model executed under the backend's context on the same card.

Threads: every public call binds the card's context on the calling thread first (`bind`), so
camera readers (`VdecChannel.send`) and preparers (`letterbox`, `decode_jpeg`) need no setup;
`context` is there for callers that make other pyACL calls of their own. JPEGD and VPC run on a
per-thread `dvpp_vpc.Lane` (own stream and descriptors), so preparers do not serialise on a lock.

Calls used, as the pyACL wrapper defines them (`hicann/runtime`, `python/pyACL`):
`acl.util.start_thread(func, args) -> (thread_id, ret)` (func is called as func(args)),
`acl.util.stop_thread(thread_id) -> ret` (joins), `acl.rt.subscribe_report(thread_id, stream) ->
ret`, `acl.rt.unsubscribe_report(thread_id, stream) -> ret`, `acl.rt.process_report(timeout_ms) -> ret`
(507012 ACL_ERROR_RT_REPORT_TIMEOUT when nothing came), `acl.media.dvpp_create_channel_desc() ->
desc`, `dvpp_create_channel(desc) -> ret`, `dvpp_destroy_channel(desc) -> ret`,
`dvpp_destroy_channel_desc(desc) -> ret`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

import acl
import numpy as np

from ..errors import BackendError
from . import acl_runtime as rt
from .acl_runtime import check, checked
from .dvpp_limits import canvas_size, limits_for
from .dvpp_pic import DevicePicture, dvpp_malloc, read_back
from .dvpp_vdec import VdecChannel
from .dvpp_vpc import MAX_LANES, Canvases, JpegSlot, Lane, letterbox
from .undo import UndoStack, raise_collected

if TYPE_CHECKING:
    from ..preprocess.letterbox import Geometry

log = logging.getLogger(__name__)

#: how long one acl.rt.process_report waits (ms): also how long close waits for the thread to notice
REPORT_TIMEOUT_MS = 100
#: codes process_report answers when no report came in time (not errors)
REPORT_IDLE = (507012, 100036)  # ACL_ERROR_RT_REPORT_TIMEOUT, ACL_ERROR_WAIT_CALLBACK_TIMEOUT


class CardState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"


class DvppCard:
    """One Ascend device's DVPP (see the module docstring). Thread-safe: `open_vdec`,
    `decode_jpeg`, `letterbox`, `jpeg_slot`, `alloc_canvas` from any thread; `open`/`close` once."""

    def __init__(self, device: int, soc: str | None = None):
        self.device = int(device)
        self.soc = soc
        self.state = CardState.NEW
        self.context = 0
        self.stream = 0
        self.channel_desc = 0
        self.report_thread_id = 0
        self.memcpy_in = rt.ACL_MEMCPY_HOST_TO_DEVICE
        self.canvases = Canvases()
        self._process = rt.PROCESS
        self._undo = UndoStack()
        self._lock = threading.Lock()
        self._running = False
        self._go = threading.Event()  # the report thread starts reporting once subscribed
        self._report_failures = 0
        self._vdecs: list[VdecChannel] = []
        self._lanes: dict[int, Lane] = {}
        self._extra = UndoStack()  # lanes, JPEG slots, canvases: made after open, released before

    # -- open / close ---------------------------------------------------------------------------
    def open(self) -> None:
        if self.state is not CardState.NEW:
            raise BackendError(f"DVPP of device {self.device} is {self.state.value}; open it once")
        process = self._process
        process.register(self)
        try:
            process.acquire()
            self._undo.push("release pyACL (acl.finalize when last)", process.release)
            self._open_device()
            self._open_channel()
            self._start_reports()
        except BaseException:
            for err in self._undo.unwind():
                log.error("while releasing the DVPP of device %d after a failed open: %s", self.device, err)
            self.state = CardState.CLOSED
            raise
        finally:
            process.settle(self)
        self.state = CardState.OPEN
        lim = limits_for(self.soc)
        log.info("DVPP of device %d (%s) open: up to %d VDEC channels, ~%d 1080p frames/s%s", self.device,
                 self.soc or "unknown SoC", lim.vdec_channels, lim.vdec_fps_1080p, lim.budget_note())

    def _open_device(self) -> None:
        device = self.device
        check(acl.rt.set_device(device), "acl.rt.set_device", f"device {device}")
        self._undo.push("reset device", lambda: check(acl.rt.reset_device(device), "acl.rt.reset_device"))
        context = checked(acl.rt.create_context(device), "acl.rt.create_context", f"device {device}")
        self.context = context
        self._undo.push("destroy the DVPP context",
                        lambda: check(acl.rt.destroy_context(context), "acl.rt.destroy_context"))
        stream = checked(acl.rt.create_stream(), "acl.rt.create_stream")
        self.stream = stream
        self._undo.push("destroy the DVPP stream",
                        lambda: check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream"))
        run_mode = checked(acl.rt.get_run_mode(), "acl.rt.get_run_mode")
        if run_mode == rt.ACL_DEVICE:  # on the card's own CPU "host" memory is device memory
            self.memcpy_in = rt.ACL_MEMCPY_DEVICE_TO_DEVICE
        if self.soc is None:
            self.soc = acl.get_soc_name() or None

    def _open_channel(self) -> None:
        m = acl.media
        desc = m.dvpp_create_channel_desc()
        if not desc:
            raise BackendError("acl.media.dvpp_create_channel_desc returned no descriptor")
        self._undo.push("destroy the DVPP channel descriptor",
                        lambda: check(m.dvpp_destroy_channel_desc(desc), "acl.media.dvpp_destroy_channel_desc"))
        check(m.dvpp_create_channel(desc), "acl.media.dvpp_create_channel", f"device {self.device}")
        self.channel_desc = desc
        self._undo.push("destroy the DVPP channel",
                        lambda: check(m.dvpp_destroy_channel(desc), "acl.media.dvpp_destroy_channel"))

    def _start_reports(self) -> None:
        """Start the report thread and subscribe it to the card's stream before it first calls
        process_report: a thread nothing is subscribed to gets 107012 (ACL_ERROR_RT_THREAD_SUBSCRIBE)
        from process_report, and VDEC channels (which subscribe it themselves) come and go."""
        self._running = True
        thread_id = checked(acl.util.start_thread(self._report_loop, [self.context]), "acl.util.start_thread")
        self.report_thread_id = thread_id
        try:
            check(acl.rt.subscribe_report(thread_id, self.stream), "acl.rt.subscribe_report")
        except BaseException:
            self._stop_reports(subscribed=False)
            raise
        self._undo.push("stop the VDEC report thread", self._stop_reports)
        self._go.set()

    def _report_loop(self, args: list) -> None:
        """The report thread: VDEC callbacks of every channel of this card run in here."""
        self._go.wait()
        if not self._running:
            return
        ret = acl.rt.set_context(args[0])
        if ret:
            log.error("DVPP report thread of device %d cannot bind its context: %s", self.device, rt.AclError(
                "acl.rt.set_context", ret))
            return
        while self._running:
            ret = acl.rt.process_report(REPORT_TIMEOUT_MS)
            if ret and ret not in REPORT_IDLE:
                self._report_failures += 1
                if self._report_failures in (1, 10, 100) or self._report_failures % 1000 == 0:
                    log.warning("DVPP report thread of device %d: %s (%d so far)", self.device,
                                rt.AclError("acl.rt.process_report", ret), self._report_failures)
                time.sleep(REPORT_TIMEOUT_MS / 1000)  # a failing call returns at once: do not spin

    def _stop_reports(self, subscribed: bool = True) -> None:
        """Let the loop end (within one process_report timeout), join it, then unsubscribe (a
        thread still in process_report when its last subscription goes would get 107012)."""
        self._running = False
        self._go.set()
        thread_id, self.report_thread_id = self.report_thread_id, 0
        try:
            check(acl.util.stop_thread(thread_id), "acl.util.stop_thread", "the DVPP report thread")
        finally:
            if subscribed:
                check(acl.rt.unsubscribe_report(thread_id, self.stream), "acl.rt.unsubscribe_report")

    def close(self) -> None:
        """Everything open() and later calls took, in reverse; idempotent."""
        with self._lock:
            if self.state is CardState.CLOSED:
                return
            self.state = CardState.CLOSED
            vdecs, self._vdecs = list(self._vdecs), []
        errors: list[Exception] = []
        try:
            self.activate()
        except BackendError as exc:
            errors.append(exc)
        for channel in reversed(vdecs):
            try:
                channel.close()
            except Exception as exc:  # noqa: BLE001 - collected, raised below
                errors.append(exc)
        errors += self._extra.unwind()
        self._lanes.clear()
        self.canvases.forget()
        errors += self._undo.unwind()
        raise_collected(errors, f"the DVPP of device {self.device}")

    # -- per-thread use -------------------------------------------------------------------------
    def bind(self) -> None:
        """Make the card's context current on this thread."""
        if self.state is not CardState.OPEN:
            raise BackendError(f"DVPP of device {self.device} is {self.state.value}")
        check(acl.rt.set_context(self.context), "acl.rt.set_context", f"DVPP of device {self.device}")

    def activate(self) -> None:
        """Bind the card's context whatever the card's state (for releasing what it took)."""
        if self.context:
            check(acl.rt.set_context(self.context), "acl.rt.set_context", f"DVPP of device {self.device}")

    def forget_canvas(self, ptr: int) -> None:
        """The canvas at `ptr` was written by something other than `letterbox` (or its memory now
        holds another canvas): the next letterbox into it redraws the grey."""
        self.canvases.forget(ptr)

    def _lane(self) -> Lane:
        self.bind()
        key = threading.get_ident()
        lane = self._lanes.get(key)
        if lane is None:
            with self._lock:
                if len(self._lanes) >= MAX_LANES:
                    raise BackendError(f"more than {MAX_LANES} threads use the DVPP of device {self.device}")
                lane = self._lanes[key] = Lane(self._extra, f"DVPP lane {len(self._lanes) + 1} of device {self.device}")
        return lane

    # -- VDEC -----------------------------------------------------------------------------------
    def open_vdec(self, name: str, codec: str, width: int, height: int, ring: int,
                  on_picture: Callable[[DevicePicture], None], on_error: Callable[[int], None] | None = None,
                  profile: str | None = None, wait_s: float = 1.0) -> VdecChannel:
        """A VDEC channel for one camera (see `dvpp_vdec.VdecChannel`), with the lowest free
        channel id of this card."""
        self.bind()
        with self._lock:
            used = {v.channel_id for v in self._vdecs}
            limit = limits_for(self.soc).vdec_channels
            channel_id = next((i for i in range(limit) if i not in used), None)
            if channel_id is None:
                raise BackendError(f"device {self.device} has all its {limit} VDEC channels in use")
            channel = VdecChannel(self, name, codec, width, height, ring, on_picture, channel_id,
                                  on_error=on_error, profile=profile, wait_s=wait_s)
            self._vdecs.append(channel)
        return channel

    def forget_vdec(self, channel: VdecChannel) -> None:
        """A channel closed itself: its id is free again."""
        with self._lock:
            if channel in self._vdecs:
                self._vdecs.remove(channel)

    # -- JPEGD and VPC --------------------------------------------------------------------------
    def jpeg_slot(self, name: str = "") -> JpegSlot:
        """A JPEG decode target for one caller (buffers grown on demand, released at close)."""
        self.bind()
        with self._lock:
            return JpegSlot(self, self._extra, name or f"{id(self):x}")

    def decode_jpeg(self, data: bytes, slot: JpegSlot) -> DevicePicture:
        """JPEGD of `data` into `slot`, synchronous; the picture is valid until the slot's next decode."""
        return slot.decode(self._lane(), data)

    def alloc_canvas(self, width: int, height: int) -> int:
        """DVPP memory for an NV12 canvas of `width` x `height` (a model input slot VPC writes);
        freed at close."""
        self.bind()
        with self._lock:
            return dvpp_malloc(self._extra, canvas_size(width, height), f"a {width}x{height} canvas")

    def to_host(self, picture: DevicePicture) -> np.ndarray:
        """The picture copied back as NV12 (`dvpp_pic.read_back`), when somebody needs its pixels."""
        self.bind()
        memcpy_out = rt.ACL_MEMCPY_DEVICE_TO_DEVICE if self.memcpy_in == rt.ACL_MEMCPY_DEVICE_TO_DEVICE \
            else rt.ACL_MEMCPY_DEVICE_TO_HOST
        return read_back(picture, memcpy_out)

    def letterbox(self, picture: DevicePicture, dst_ptr: int, dst_w: int, dst_h: int) -> Geometry:
        """VPC letterbox of `picture` into the NV12 canvas at `dst_ptr` (see `dvpp_vpc.letterbox`);
        returns the geometry VPC used (Ultralytics' on VPC's grid: `dvpp_limits.vpc_letterbox`).

        The canvas must be DVPP memory of this card (`alloc_canvas`: VPC's output buffers come
        from acldvppMalloc, by the CANN VPC page), `dst_w` a multiple of 16 and `dst_h` even; the
        caller does not release `picture` before this returns (it is synchronous)."""
        return letterbox(self, self._lane(), picture, dst_ptr, dst_w, dst_h)

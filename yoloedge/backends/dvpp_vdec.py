"""One camera's hardware H.264/H.265 decoder (DVPP VDEC V1, `acl.media.vdec_*`).

Everything is allocated once, when the channel opens, and reused for the camera's lifetime,
reconnects included (a reconnect sends EOS with `flush()` and goes on sending; the channel is
closed only when the camera is removed):

* `ring` output pictures: NV12 buffers in DVPP memory, each with its picture descriptor, set up
  once; sized for strides of 64 x 16 (`dvpp_limits.vdec_buffer_size`), more than the 16 x 2 VDEC
  is documented to use, so a chip that aligns coarser still fits; the strides VDEC actually used
  are read back from the descriptor of every picture;
* `ring` input slots: a stream descriptor and a DVPP buffer for one access unit each. An access
  unit's buffer must stay untouched until VDEC has reported the frame (the decode is
  asynchronous), so each frame in flight holds its own slot. The slots' buffers are allocated at
  open (an eighth of a raw frame each, at least 64 KiB: an IDR of a camera stream rarely comes
  near it) and one is reallocated only when an access unit does not fit it, to the largest one
  the channel has seen (`stats.grown`).

The ring must be deeper than the stream's reorder delay (frames VDEC holds before it outputs the
first: 0 for the Baseline/Main streams most cameras send without B-frames, up to the DPB size with
B-frames) plus the pictures the consumer holds at once; a shallower ring drops frames.

`send()` (the camera's reader thread) takes a free input slot and a free picture, copies the
Annex-B access unit into the slot's buffer and hands both to `vdec_send_frame`. When none is free
it waits at most `wait_s` and then drops the access unit (`stats.dropped`): a stalled consumer
must not stall the reader, and a dropped frame is counted, never silent. (Dropping an access unit
makes the decoder's next frames reference a missing picture until the next IDR; VDEC reports those
as errors or decodes them with artefacts: the count says how often it happened.)

The callback runs on the card's report thread (`DvppCard`: `acl.util.start_thread` looping on
`acl.rt.process_report`). pyACL calls it as `callback(stream_desc, pic_desc, user_data)` with the
descriptors of the send it completes (`media_vdec.cpp`); they are looked up by handle, the input
slot is freed, the picture gets the smallest pts still waiting (display order: see `_next_pts`),
and then either
`on_picture(DevicePicture)` gets the picture (the consumer calls `release()` when done) or, when
the picture descriptor's ret code is non-zero, the picture goes straight back to the ring, the
error is counted and `on_error(code)` is called if given. An exception from either callback is
logged and counted (`stats.callback_failures`), never raised into pyACL.

`close()`: `vdec_destroy_channel` first (it waits for the outstanding callbacks, so the report
thread must still be running: the card closes its channels before stopping it), then the channel
and frame descriptors, then the pictures' and the input slots' descriptors and memory.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import acl

from ..errors import BackendError
from .acl_runtime import check, checked
from .dvpp_limits import PIXEL_FORMAT_YUV_SEMIPLANAR_420, align_up, vdec_buffer_size, vdec_entype, vdec_strides
from .dvpp_pic import DevicePicture, create_pic_desc, describe_nv12, dvpp_malloc, read_nv12
from .undo import UndoStack, raise_collected

if TYPE_CHECKING:
    from .dvpp import DvppCard

log = logging.getLogger(__name__)

#: VDEC out mode 0: the default output mode (pictures in decode completion order)
VDEC_OUT_MODE_DEFAULT = 0


@dataclass
class VdecStats:
    sent: int = 0
    decoded: int = 0
    errors: int = 0
    dropped: int = 0
    grown: int = 0
    callback_failures: int = 0


class _Input:
    """One in-flight access unit's stream descriptor and DVPP buffer."""

    def __init__(self, desc: int):
        self.desc, self.ptr, self.cap = desc, 0, 0


class VdecChannel:
    def __init__(self, card: DvppCard, name: str, codec: str, width: int, height: int, ring: int,
                 on_picture: Callable[[DevicePicture], None], channel_id: int,
                 on_error: Callable[[int], None] | None = None, profile: str | None = None,
                 wait_s: float = 1.0):
        if ring < 1:
            raise ValueError("a VDEC ring needs at least one picture")
        self.card, self.name, self.channel_id = card, name, channel_id
        self.width, self.height, self.ring_size = int(width), int(height), int(ring)
        self.entype = vdec_entype(codec, profile)
        self.stats = VdecStats()
        self.wait_s = wait_s
        self._on_picture, self._on_error = on_picture, on_error
        self._undo = UndoStack()
        self._cond = threading.Condition()
        self._free_pics: list[int] = []  # pic desc handles
        self._free_inputs: list[_Input] = []
        self._pics: dict[int, tuple[int, int]] = {}  # pic desc -> (ptr, size)
        self._inputs: dict[int, _Input] = {}  # stream desc -> slot
        self._channel_desc = 0
        self._frame_config = 0
        self._eos_desc = 0
        self._eos_pending = False  # an EOS was sent and its callback has not come yet
        self._pts: list[int] = []  # pts (us) of the frames sent and not yet reported, a min-heap
        self._first_cap = max(64 << 10, self.width * self.height // 8)
        self._largest = 0
        self._closed = False
        self._open()

    # -- open --------------------------------------------------------------------------------
    def _open(self) -> None:
        m = acl.media
        try:
            size = vdec_buffer_size(self.width, self.height)
            for i in range(self.ring_size):
                ptr = dvpp_malloc(self._undo, size, f"{self.name} picture {i}")
                desc = create_pic_desc(self._undo, f"{self.name} picture {i}")
                describe_nv12(desc, ptr, size)
                self._pics[desc] = (ptr, size)
                self._free_pics.append(desc)
            for i in range(self.ring_size):
                slot = _Input(self._stream_desc(f"{self.name} input {i}"))
                self._inputs[slot.desc] = slot
                self._free_inputs.append(slot)
            self._undo.push(f"free the input buffers of {self.name}", self._free_inputs_memory)
            cap = align_up(self._first_cap, 64 << 10)
            for slot in self._inputs.values():
                slot.ptr = checked(acl.media.dvpp_malloc(cap), "acl.media.dvpp_malloc",
                                   f"{cap}-byte input of {self.name}")
                slot.cap = cap
            self._eos_desc = self._stream_desc(f"{self.name} EOS")
            config = m.vdec_create_frame_config()
            if not config:
                raise BackendError("acl.media.vdec_create_frame_config returned no config")
            self._frame_config = config
            self._undo.push("destroy the VDEC frame config",
                            lambda: check(m.vdec_destroy_frame_config(config), "acl.media.vdec_destroy_frame_config"))
            self._create_channel()
        except BaseException:
            errors = self._undo.unwind()
            for err in errors:
                log.error("while releasing %s after a failed open: %s", self.name, err)
            raise

    def _stream_desc(self, what: str) -> int:
        desc = acl.media.dvpp_create_stream_desc()
        if not desc:
            raise BackendError(f"acl.media.dvpp_create_stream_desc returned no descriptor for {what}")
        self._undo.push(f"destroy the stream descriptor of {what}",
                        lambda: check(acl.media.dvpp_destroy_stream_desc(desc), "acl.media.dvpp_destroy_stream_desc"))
        return desc

    def _create_channel(self) -> None:
        m = acl.media
        desc = m.vdec_create_channel_desc()
        if not desc:
            raise BackendError("acl.media.vdec_create_channel_desc returned no descriptor")
        self._channel_desc = desc
        self._undo.push("destroy the VDEC channel descriptor",
                        lambda: check(m.vdec_destroy_channel_desc(desc), "acl.media.vdec_destroy_channel_desc"))
        for call, value in (("channel_id", self.channel_id), ("thread_id", self.card.report_thread_id),
                            ("entype", self.entype), ("out_pic_format", PIXEL_FORMAT_YUV_SEMIPLANAR_420),
                            ("out_mode", VDEC_OUT_MODE_DEFAULT)):
            check(getattr(m, f"vdec_set_channel_desc_{call}")(desc, value), f"acl.media.vdec_set_channel_desc_{call}",
                  self.name)
        check(m.vdec_set_channel_desc_callback(desc, self._callback), "acl.media.vdec_set_channel_desc_callback")
        check(m.vdec_create_channel(desc), "acl.media.vdec_create_channel",
              f"{self.name}: channel {self.channel_id}, {self.width}x{self.height}")
        self._undo.push("destroy the VDEC channel",
                        lambda: check(m.vdec_destroy_channel(desc), "acl.media.vdec_destroy_channel", self.name))

    def _free_inputs_memory(self) -> None:
        failed = 0
        for slot in self._inputs.values():
            if slot.ptr:
                ptr, slot.ptr, slot.cap = slot.ptr, 0, 0
                failed = failed or acl.media.dvpp_free(ptr)
        check(failed, "acl.media.dvpp_free", f"the input buffers of {self.name}")

    # -- sending -----------------------------------------------------------------------------
    def _take(self) -> tuple[_Input, int] | None:
        deadline = time.monotonic() + self.wait_s
        with self._cond:
            while not (self._free_inputs and self._free_pics):
                if self._closed:
                    raise BackendError(f"{self.name}: the VDEC channel is closed")
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
            return self._free_inputs.pop(), self._free_pics.pop()

    def _give(self, slot: _Input | None = None, pic: int | None = None) -> None:
        with self._cond:
            if slot is not None:
                self._free_inputs.append(slot)
            if pic is not None:
                self._free_pics.append(pic)
            self._cond.notify_all()

    def send(self, access_unit: bytes, pts: float) -> bool:
        """Decode one Annex-B access unit; False when it was dropped (no free slot in time)."""
        if self._closed:
            raise BackendError(f"{self.name}: the VDEC channel is closed")
        size = len(access_unit)
        if not size:
            return True
        taken = self._take()
        if taken is None:
            self.stats.dropped += 1
            return False
        slot, pic = taken
        try:
            self.card.bind()
            self._fill(slot, access_unit)
            m = acl.media
            ptr, pic_size = self._pics[pic]
            describe_nv12(pic, ptr, pic_size)  # VDEC may have written a smaller size into it
            check(m.dvpp_set_stream_desc_data(slot.desc, slot.ptr), "acl.media.dvpp_set_stream_desc_data")
            check(m.dvpp_set_stream_desc_size(slot.desc, size), "acl.media.dvpp_set_stream_desc_size")
            stamp = max(0, int(round(pts * 1e6)))
            check(m.dvpp_set_stream_desc_timestamp(slot.desc, stamp), "acl.media.dvpp_set_stream_desc_timestamp")
            check(m.dvpp_set_stream_desc_eos(slot.desc, 0), "acl.media.dvpp_set_stream_desc_eos")
            with self._cond:
                heapq.heappush(self._pts, stamp)  # before the send: its callback may come first
            try:
                check(m.vdec_send_frame(self._channel_desc, slot.desc, pic, self._frame_config, None),
                      "acl.media.vdec_send_frame", f"{self.name}: {size}-byte access unit")
            except BaseException:
                with self._cond:
                    self._pts.remove(stamp)
                    heapq.heapify(self._pts)
                raise
        except BaseException:
            self._give(slot, pic)
            raise
        self.stats.sent += 1
        return True

    def _fill(self, slot: _Input, data: bytes) -> None:
        size = len(data)
        self._largest = max(self._largest, size)
        if slot.cap < size:
            if slot.ptr:
                ptr, slot.ptr, slot.cap = slot.ptr, 0, 0
                check(acl.media.dvpp_free(ptr), "acl.media.dvpp_free", f"growing an input buffer of {self.name}")
                self.stats.grown += 1
            cap = align_up(max(self._largest, self._first_cap), 64 << 10)
            slot.ptr = checked(acl.media.dvpp_malloc(cap), "acl.media.dvpp_malloc", f"{cap}-byte input of {self.name}")
            slot.cap = cap
        host = acl.util.bytes_to_ptr(data)
        check(acl.rt.memcpy(slot.ptr, slot.cap, host, size, self.card.memcpy_in), "acl.rt.memcpy",
              f"{self.name}: access unit to the card")

    def flush(self, timeout_s: float = 5.0) -> bool:
        """End of stream: VDEC outputs what it still holds; waits (at most `timeout_s`) until every
        frame sent has been reported. True when all were."""
        if self._closed:
            return True
        self.card.bind()
        if not self._wait(lambda: not self._eos_pending, timeout_s):
            return False  # the previous EOS is still VDEC's
        m = acl.media
        check(m.dvpp_set_stream_desc_data(self._eos_desc, 0), "acl.media.dvpp_set_stream_desc_data")
        check(m.dvpp_set_stream_desc_size(self._eos_desc, 0), "acl.media.dvpp_set_stream_desc_size")
        check(m.dvpp_set_stream_desc_eos(self._eos_desc, 1), "acl.media.dvpp_set_stream_desc_eos")
        with self._cond:
            self._eos_pending = True
        try:
            check(m.vdec_send_frame(self._channel_desc, self._eos_desc, 0, self._frame_config, None),
                  "acl.media.vdec_send_frame", f"{self.name}: end of stream")
        except BaseException:
            with self._cond:
                self._eos_pending = False
            raise
        return self._wait(lambda: not self._eos_pending and len(self._free_inputs) == len(self._inputs), timeout_s)

    def _wait(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    @property
    def in_flight(self) -> int:
        with self._cond:
            return len(self._inputs) - len(self._free_inputs)

    @property
    def free_pictures(self) -> int:
        with self._cond:
            return len(self._free_pics)

    # -- the report thread -------------------------------------------------------------------
    def _callback(self, stream_desc: int, pic_desc: int, _user_data: object) -> None:
        try:
            self._report(stream_desc, pic_desc)
        except Exception:  # noqa: BLE001 - raising into pyACL's callback would lose it
            self.stats.callback_failures += 1
            log.exception("%s: VDEC callback failed", self.name)

    def _next_pts(self) -> float:
        """The presentation time of the picture being reported: pictures come out in display
        order, which is the order of their pts, whichever send's descriptors VDEC returns them
        with (how the card pairs a reordered picture with a send is UNCONFIRMED; the fake pairs
        it with the oldest waiting send)."""
        with self._cond:
            return heapq.heappop(self._pts) / 1e6 if self._pts else 0.0

    def _report(self, stream_desc: int, pic_desc: int) -> None:
        m = acl.media
        slot = self._inputs.get(stream_desc)
        pts = self._next_pts() if slot is not None else 0.0
        if slot is not None:
            self._give(slot=slot)
        elif stream_desc and stream_desc == self._eos_desc:
            with self._cond:
                self._eos_pending = False
                self._cond.notify_all()
        if not pic_desc or pic_desc not in self._pics:
            return  # the EOS frame (no picture), or not one of ours
        code = int(m.dvpp_get_pic_desc_ret_code(pic_desc))
        if code:
            self.stats.errors += 1
            self._give(pic=pic_desc)
            if self._on_error is not None:
                self._on_error(code)
            return
        ptr, size = self._pics[pic_desc]
        width, height, w_stride, h_stride = read_nv12(pic_desc)
        if not (w_stride and h_stride):
            w_stride, h_stride = vdec_strides(width or self.width, height or self.height)
        picture = DevicePicture(self.card.device, ptr, size, width or self.width, height or self.height,
                                w_stride, h_stride, pts, _give_back=self._picture_returner(pic_desc))
        self.stats.decoded += 1
        self._on_picture(picture)

    def _picture_returner(self, pic_desc: int) -> Callable[[DevicePicture], None]:
        def give_back(_picture: DevicePicture) -> None:
            self._give(pic=pic_desc)
        return give_back

    # -- close -------------------------------------------------------------------------------
    def close(self) -> None:
        """Destroy the channel, then its descriptors and memory; idempotent. Pictures still
        held by consumers must not be read after this."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        errors: list[Exception] = []
        try:
            self.card.activate()
        except BackendError as exc:
            errors.append(exc)
        errors += self._undo.unwind()
        self.card.forget_vdec(self)
        raise_collected(errors, f"VDEC channel {self.name}")

"""JPEGD and VPC on one card, from any number of calling threads at once.

Each thread that calls in gets its own `Lane`: a stream, the two picture descriptors and the two
ROI configs a crop-and-paste needs, created once (the first call on that thread) and released when
the card closes. Per-thread lanes instead of one lock: the preparers of several cameras letterbox
in parallel, each waiting only for its own stream, and no descriptor is ever rewritten while
another thread's operation may still read it. Lanes are kept until the card closes (preparer
threads live as long as the card); `MAX_LANES` bounds them so a caller that spawns threads per
frame fails loudly instead of leaking streams.

A `JpegSlot` is one caller's JPEG decode target: the input (compressed bytes) and output (NV12)
DVPP buffers, allocated on the first image and reallocated only when a bigger one comes, and its
output picture descriptor. One slot holds one picture at a time: decoding into it again overwrites
the previous picture, so a caller with several pictures in flight keeps a slot for each.

Calls (pyACL wrapper `media_jpeg.cpp`, `media_vpc.cpp`):
`dvpp_jpeg_get_image_info(host_ptr, size) -> (width, height, components, ret)`,
`dvpp_jpeg_predict_dec_size(host_ptr, size, pixel_format) -> (size, ret)`,
`dvpp_jpeg_decode_async(channel_desc, dvpp_ptr, size, out_pic_desc, stream) -> ret`,
`dvpp_create_roi_config(left, right, top, bottom) -> roi` (right/bottom inclusive),
`dvpp_set_roi_config(roi, left, right, top, bottom) -> ret`,
`dvpp_vpc_crop_and_paste_async(channel_desc, in_desc, out_desc, crop_roi, paste_roi, stream) -> ret`;
and `acl.rt.memset(ptr, max, value, count) -> ret` for the canvas's grey.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import acl

from ..errors import BackendError
from .acl_runtime import check, checked
from .dvpp_limits import (PAD_UV, PAD_Y, PIXEL_FORMAT_YUV_SEMIPLANAR_420, canvas_size, jpegd_strides,
                          nv12_size, vpc_letterbox)
from .dvpp_pic import DevicePicture, create_pic_desc, describe_nv12, read_nv12
from .undo import UndoStack

if TYPE_CHECKING:
    from ..preprocess.letterbox import Geometry
    from .dvpp import DvppCard

log = logging.getLogger(__name__)

#: the most threads that may call JPEGD/VPC on one card (each holds a stream)
MAX_LANES = 32


class Lane:
    """One calling thread's stream, descriptors and ROI configs (see the module docstring)."""

    def __init__(self, undo: UndoStack, name: str):
        stream = checked(acl.rt.create_stream(), "acl.rt.create_stream", name)
        undo.push(f"destroy the stream of {name}",
                  lambda: check(acl.rt.destroy_stream(stream), "acl.rt.destroy_stream"))
        self.stream = stream
        self.src_desc = create_pic_desc(undo, f"{name}'s VPC input")
        self.dst_desc = create_pic_desc(undo, f"{name}'s VPC output")
        self.crop = self._roi(undo, f"{name}'s crop area")
        self.paste = self._roi(undo, f"{name}'s paste area")

    @staticmethod
    def _roi(undo: UndoStack, what: str) -> int:
        roi = acl.media.dvpp_create_roi_config(0, 1, 0, 1)
        if not roi:
            raise BackendError(f"acl.media.dvpp_create_roi_config returned no config for {what}")
        undo.push(f"destroy {what}", lambda: check(acl.media.dvpp_destroy_roi_config(roi),
                                                    "acl.media.dvpp_destroy_roi_config"))
        return roi

    def sync(self, call: str) -> None:
        check(acl.rt.synchronize_stream(self.stream), "acl.rt.synchronize_stream", f"after {call}")


class JpegSlot:
    """DVPP buffers for one caller's JPEG decodes (see the module docstring); made by
    `DvppCard.jpeg_slot()`, released when the card closes. `grown` counts reallocations."""

    def __init__(self, card: DvppCard, undo: UndoStack, name: str):
        self.card, self.name = card, name
        self.in_ptr = self.in_cap = self.out_ptr = self.out_cap = 0
        self.grown = 0
        self.desc = create_pic_desc(undo, f"JPEG slot {name}")
        undo.push(f"free the buffers of JPEG slot {name}", self._free)

    def _free(self) -> None:
        errors = []
        for attr in ("in_ptr", "out_ptr"):
            ptr = getattr(self, attr)
            if ptr:
                setattr(self, attr, 0)
                ret = acl.media.dvpp_free(ptr)
                if ret:
                    errors.append(ret)
        self.in_cap = self.out_cap = 0
        if errors:
            check(errors[0], "acl.media.dvpp_free", f"JPEG slot {self.name}")

    def _ensure(self, attr: str, need: int) -> int:
        """The buffer `attr` ("in" / "out"), at least `need` bytes: reallocated only when smaller."""
        ptr, cap = getattr(self, f"{attr}_ptr"), getattr(self, f"{attr}_cap")
        if cap >= need:
            return ptr
        if ptr:
            setattr(self, f"{attr}_ptr", 0)
            setattr(self, f"{attr}_cap", 0)
            check(acl.media.dvpp_free(ptr), "acl.media.dvpp_free", f"growing JPEG slot {self.name}")
            self.grown += 1
        ptr = checked(acl.media.dvpp_malloc(int(need)), "acl.media.dvpp_malloc",
                      f"{need} bytes for JPEG slot {self.name}")
        setattr(self, f"{attr}_ptr", ptr)
        setattr(self, f"{attr}_cap", need)
        return ptr

    def decode(self, lane: Lane, data: bytes) -> DevicePicture:
        """JPEGD of `data` into this slot (async on the lane's stream, then synchronised)."""
        card = self.card
        size = len(data)
        if not size:
            raise BackendError("an empty JPEG")
        host = acl.util.bytes_to_ptr(data)  # valid while `data` lives: until this call returns
        width, height, _components = checked(acl.media.dvpp_jpeg_get_image_info(host, size),
                                             "acl.media.dvpp_jpeg_get_image_info", f"{size}-byte JPEG")
        out_size = checked(acl.media.dvpp_jpeg_predict_dec_size(host, size, PIXEL_FORMAT_YUV_SEMIPLANAR_420),
                           "acl.media.dvpp_jpeg_predict_dec_size")
        w_stride, h_stride = jpegd_strides(width, height, card.soc)
        out_size = max(int(out_size), nv12_size(w_stride, h_stride))
        src = self._ensure("in", size)
        dst = self._ensure("out", out_size)
        check(acl.rt.memcpy(src, self.in_cap, host, size, card.memcpy_in), "acl.rt.memcpy",
              f"{size}-byte JPEG to the card")
        describe_nv12(self.desc, dst, self.out_cap, width, height, w_stride, h_stride)
        check(acl.media.dvpp_jpeg_decode_async(card.channel_desc, src, size, self.desc, lane.stream),
              "acl.media.dvpp_jpeg_decode_async", f"{width}x{height} JPEG")
        lane.sync("dvpp_jpeg_decode_async")
        got_w, got_h, got_ws, got_hs = read_nv12(self.desc)
        return DevicePicture(card.device, dst, self.out_cap, got_w or width, got_h or height,
                             got_ws or w_stride, got_hs or h_stride, 0.0, _give_back=_nothing)


def _nothing(_picture: DevicePicture) -> None:
    """A JPEG slot's picture needs no giving back: the next decode into the slot replaces it."""


class Canvases:
    """The letterbox geometry each canvas was last written with, so that the grey padding is
    only redrawn when it changes (VPC's paste writes only the paste rectangle)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[int, tuple[int, int, Geometry]] = {}

    def needs_fill(self, ptr: int, width: int, height: int, geo: Geometry) -> bool:
        with self._lock:
            if self._last.get(ptr) == (width, height, geo):
                return False
            self._last.pop(ptr, None)  # until the fill is done, a failure leaves it to redo
            return True

    def filled(self, ptr: int, width: int, height: int, geo: Geometry) -> None:
        with self._lock:
            self._last[ptr] = (width, height, geo)

    def forget(self, ptr: int | None = None) -> None:
        with self._lock:
            if ptr is None:
                self._last.clear()
            else:
                self._last.pop(ptr, None)


def letterbox(card: DvppCard, lane: Lane, picture: DevicePicture, dst_ptr: int, dst_w: int, dst_h: int) -> Geometry:
    """VPC crop-and-paste of the whole `picture` into the centred rectangle of an NV12 canvas
    `dst_w` x `dst_h` at `dst_ptr`; the rest of the canvas is the letterbox grey."""
    if picture.released:
        raise BackendError("letterbox of a picture that was already released")
    if picture.device != card.device:
        raise BackendError(f"a picture of device {picture.device} given to the DVPP of device {card.device}")
    plan = vpc_letterbox(picture.width, picture.height, dst_w, dst_h)
    geo = plan.geometry()
    size = canvas_size(dst_w, dst_h)
    if card.canvases.needs_fill(dst_ptr, dst_w, dst_h, geo):
        luma = dst_w * dst_h
        check(acl.rt.memset(int(dst_ptr), luma, PAD_Y, luma), "acl.rt.memset", "the canvas's Y plane")
        check(acl.rt.memset(int(dst_ptr) + luma, size - luma, PAD_UV, size - luma), "acl.rt.memset",
              "the canvas's UV plane")
        filled = True
    else:
        filled = False
    describe_nv12(lane.src_desc, picture.ptr, picture.size, picture.width, picture.height,
                  picture.width_stride, picture.height_stride)
    describe_nv12(lane.dst_desc, dst_ptr, size, dst_w, dst_h, dst_w, dst_h)
    check(acl.media.dvpp_set_roi_config(lane.crop, *plan.crop), "acl.media.dvpp_set_roi_config", "crop area")
    check(acl.media.dvpp_set_roi_config(lane.paste, *plan.paste), "acl.media.dvpp_set_roi_config", "paste area")
    check(acl.media.dvpp_vpc_crop_and_paste_async(card.channel_desc, lane.src_desc, lane.dst_desc, lane.crop,
                                                  lane.paste, lane.stream),
          "acl.media.dvpp_vpc_crop_and_paste_async",
          f"{picture.width}x{picture.height} into {plan.new_w}x{plan.new_h} at ({plan.left},{plan.top}) "
          f"of {dst_w}x{dst_h}")
    lane.sync("dvpp_vpc_crop_and_paste_async")
    if filled:
        card.canvases.filled(dst_ptr, dst_w, dst_h, geo)
    return geo

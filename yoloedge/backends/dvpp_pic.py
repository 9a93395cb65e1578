"""A decoded picture on the card, and the small pyACL media steps every DVPP part repeats.

`DevicePicture` is what VDEC's callback and JPEGD hand out: an NV12 picture in DVPP memory of one
card, with the strides the hardware used. It belongs to a ring (a VDEC channel's output pictures,
a JPEG slot) and `release()` gives it back; a picture is never freed per frame, its memory was
allocated once when the ring was made.

The helpers wrap the `acl.media` calls as the pyACL wrapper defines them (`hicann/runtime`,
`python/pyACL/media/media_common.cpp`): `dvpp_malloc(size) -> (ptr, ret)`, `dvpp_free(ptr) -> ret`,
`dvpp_create_pic_desc() -> desc` (0 when it fails), the `dvpp_set_pic_desc_*(desc, value) -> ret`
setters and the bare-value `dvpp_get_pic_desc_*` getters.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Callable

import acl
import numpy as np

from ..errors import BackendError
from . import acl_runtime as rt
from .acl_runtime import check, checked
from .dvpp_limits import PIXEL_FORMAT_YUV_SEMIPLANAR_420
from .undo import UndoStack


@dataclass
class DevicePicture:
    """An NV12 picture in DVPP memory of card `device`: Y plane of `width_stride` x
    `height_stride` bytes at `ptr`, the UV plane right after it; `width` x `height` are the
    picture's own pixels. `pts` is the presentation time (seconds) its access unit was sent with.

    `release()` returns it to its ring; a released picture must not be read again (the ring
    reuses its memory for a later frame). Releasing twice is harmless."""

    device: int
    ptr: int
    size: int
    width: int
    height: int
    width_stride: int
    height_stride: int
    pts: float = 0.0
    _give_back: Callable[[DevicePicture], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def released(self) -> bool:
        return self._give_back is None

    def release(self) -> None:
        with self._lock:
            give_back, self._give_back = self._give_back, None
        if give_back is not None:
            give_back(self)


def dvpp_malloc(undo: UndoStack, size: int, what: str) -> int:
    """DVPP memory (acl.media.dvpp_malloc: the alignment VDEC/JPEGD/VPC need), freed on unwind."""
    ptr = checked(acl.media.dvpp_malloc(int(size)), "acl.media.dvpp_malloc", f"{size} bytes for {what}")
    undo.push(f"free DVPP memory of {what}", lambda: check(acl.media.dvpp_free(ptr), "acl.media.dvpp_free"))
    return ptr


def create_pic_desc(undo: UndoStack, what: str) -> int:
    desc = acl.media.dvpp_create_pic_desc()
    if not desc:
        raise BackendError(f"acl.media.dvpp_create_pic_desc returned no descriptor for {what}")
    undo.push(f"destroy picture descriptor of {what}",
              lambda: check(acl.media.dvpp_destroy_pic_desc(desc), "acl.media.dvpp_destroy_pic_desc"))
    return desc


def describe_nv12(desc: int, ptr: int, size: int, width: int = 0, height: int = 0,
                  width_stride: int = 0, height_stride: int = 0) -> None:
    """Point a picture descriptor at an NV12 buffer; sizes left at 0 are not set (VDEC fills
    them in on its output pictures)."""
    m = acl.media
    check(m.dvpp_set_pic_desc_data(desc, int(ptr)), "acl.media.dvpp_set_pic_desc_data")
    check(m.dvpp_set_pic_desc_size(desc, int(size)), "acl.media.dvpp_set_pic_desc_size")
    check(m.dvpp_set_pic_desc_format(desc, PIXEL_FORMAT_YUV_SEMIPLANAR_420), "acl.media.dvpp_set_pic_desc_format")
    for setter, value in (("width", width), ("height", height), ("width_stride", width_stride),
                          ("height_stride", height_stride)):
        if value:
            check(getattr(m, f"dvpp_set_pic_desc_{setter}")(desc, int(value)), f"acl.media.dvpp_set_pic_desc_{setter}")


def read_nv12(desc: int) -> tuple[int, int, int, int]:
    """(width, height, width_stride, height_stride) as the hardware wrote them into `desc`."""
    m = acl.media
    return (int(m.dvpp_get_pic_desc_width(desc)), int(m.dvpp_get_pic_desc_height(desc)),
            int(m.dvpp_get_pic_desc_width_stride(desc)), int(m.dvpp_get_pic_desc_height_stride(desc)))


def read_back(picture: DevicePicture, memcpy_out: int) -> np.ndarray:
    """A host copy of `picture` as a (height * 3/2, width) NV12 array without the strides' padding:
    for snapshots and event best shots only (the frame path never reads pixels back). Staged in
    pinned memory allocated for the call; the caller has the picture's card context bound."""
    nbytes = picture.size
    host = checked(acl.rt.malloc_host(nbytes), "acl.rt.malloc_host", f"{nbytes} bytes to read a picture back")
    try:
        check(acl.rt.memcpy(host, nbytes, picture.ptr, nbytes, memcpy_out), "acl.rt.memcpy",
              "a picture back from the card")
        view = rt.host_array(host, nbytes)
        data = view.copy() if view is not None else np.frombuffer(acl.util.ptr_to_bytes(host, nbytes), np.uint8)
    finally:
        check(acl.rt.free_host(host), "acl.rt.free_host")
    ws, hs, w, h = picture.width_stride, picture.height_stride, picture.width, picture.height
    luma = data[:ws * hs].reshape(hs, ws)[:h, :w]
    chroma = data[ws * hs:ws * hs * 3 // 2].reshape(hs // 2, ws)[:h // 2, :w]
    return np.concatenate([luma, chroma])

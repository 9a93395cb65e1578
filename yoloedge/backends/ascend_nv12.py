"""The Ascend backend's NV12 input: an `.om` whose static AIPP takes YUV420SP (`yoloedge convert
atc --aipp yuv420sp`) is fed by the card's own DVPP (`decoder: dvpp`): its input sets are DVPP
memory that VPC letterboxes decoded pictures into, and nothing is copied in from the host. The
backend (`ascend.AscendBackend.nv12`) tells such a model by its input's size (n*h*w*3/2 bytes;
UNCONFIRMED: the dims ATC reports for it) and uses these steps.
"""

from __future__ import annotations

import dataclasses

import acl

from ..model.spec import ModelSpec
from .acl_runtime import check, checked
from .undo import UndoStack

#: the letterbox grey (RGB 114) in NV12, as the AIPP block's BT.601 limited-range matrix reads it
GREY_Y, GREY_UV = 114, 128


def as_rgb(spec: ModelSpec, capacity: int, height: int, width: int) -> ModelSpec:
    """The model described with the RGB image AIPP makes of the NV12 input (what the letterbox
    geometry and the decoders work with); its memory is the card's (`Backend.device_inputs`)."""
    image = dataclasses.replace(spec.inputs[0], shape=(capacity, height, width, 3))
    return dataclasses.replace(spec, inputs=(image,))


def dvpp_buffer(undo: UndoStack, nbytes: int) -> int:
    """One input set's memory: DVPP memory, where VPC can write (freed by `undo`)."""
    ptr = checked(acl.media.dvpp_malloc(int(nbytes)), "acl.media.dvpp_malloc", f"{nbytes}-byte NV12 input")
    undo.push("free DVPP memory", lambda: check(acl.media.dvpp_free(ptr), "acl.media.dvpp_free"))
    return ptr


def fill_grey(ptr: int, nbytes: int, item_bytes: int) -> None:
    """Each frame slot is one NV12 picture (its luma plane, then its interleaved chroma), filled
    with the letterbox grey. The card's VPC redraws a slot's padding only when its geometry
    changes, and a reopened device may get the same addresses back: fresh memory must already
    look like a padded canvas."""
    luma = item_bytes * 2 // 3
    for start in range(0, nbytes - item_bytes + 1, item_bytes):
        check(acl.rt.memset(ptr + start, nbytes - start, GREY_Y, luma), "acl.rt.memset", "NV12 input, luma")
        check(acl.rt.memset(ptr + start + luma, nbytes - start - luma, GREY_UV, item_bytes - luma), "acl.rt.memset",
              "NV12 input, chroma")

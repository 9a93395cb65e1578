"""Fake `acl.media` (DVPP V1, the API the Atlas 300I Pro / 310P supports): dvpp memory, channel,
picture and stream descriptions, JPEGD, VPC and VDEC, decoding for real so tests see real pixels.

Names, argument orders and return shapes follow pyACL's media/*.cpp (hicann/runtime): creates
return the bare handle (0 when refused), setters and destroys return `ret`, getters return the bare
value (0 for an unknown handle); `dvpp_malloc(size) -> (ptr, ret)`,
`dvpp_jpeg_get_image_info(data, size) -> (width, height, components, ret)`,
`dvpp_jpeg_predict_dec_size(data, size, fmt) -> (size, ret)`.

Memory: `dvpp_malloc` memory is real, on the current context's device (kind "dvpp" in leaks() and
allocated()); acl.rt.memcpy/memset and model execution treat it as device memory; acl.rt.free
refuses it and dvpp_free refuses anything else. The pointer is 128-byte aligned.

JPEGD (`dvpp_jpeg_decode_async`): the input must be dvpp memory (as acllite copies it there); the
fake decodes with FFmpeg's MJPEG decoder (PyAV) and writes the JPEG's own YCbCr 4:2:0 samples as
NV12/NV21 -- DVPP does no colour conversion, so JPEG output is full range (JFIF) while video
output is whatever the stream holds (limited range for ordinary H.264). UNCONFIRMED: that
4:4:4/4:2:2 JPEGs come out as 4:2:0 when the output format asks for it (the fake converts).
Output strides: on "Ascend310P3" the width stride must be a multiple of 64 and the height stride
of 16 (128/16 on other SoCs), as acllite aligns them; the size must hold stride_w*stride_h*3/2.

VPC (resize, crop, crop_resize, crop_and_paste): YUV420SP in and out (NV12 or NV21), strides
multiples of 16 (width) and 2 (height), crop/paste areas inside the pictures with even left/top
and odd right/bottom (inclusive coordinates), the paste area's left edge a multiple of 16, and a
scale between 1/32 and 16 in each direction; violations return 100000 (UNCONFIRMED: the exact
DVPP parameter code). Bilinear (OpenCV INTER_LINEAR on the Y and interleaved UV planes) from the
crop area into the paste area; the rest of the output is untouched. Runs at synchronize_stream.

VDEC (callback model): see vdec_* below; decoding is FFmpeg's (PyAV) on Annex-B input, one picture
per output description in send order (pictures come out in display order: with B-frames the
picture delivered with send n is the n-th displayed one, not the n-th sent; UNCONFIRMED how the
card pairs them). Callbacks `callback(input_stream_desc, output_pic_desc, user_data)` run only on
the channel's report thread inside acl.rt.process_report. Every send gets exactly one callback
(pyACL keeps one wrapper per send and frees it in the callback), the EOS send too (after the
flushed pictures; output 0 when it had none); a send that produced no picture by EOS gets its
callback with ret_code 1 ("decode failed" in the docs). `vdec_send_skipped_frame`'s callback gets
output 0. Until its callback the stream and picture descriptions and the output buffer belong to
VDEC: destroying or freeing them is refused (fake-only strictness).

Counters per device in `_fake.report()["media"]`: jpegd, vpc, vdec_frames, vdec_errors,
vdec_callbacks, channels created/destroyed, live dvpp allocations and bytes.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _fake
from ._fake import DEVICE_MEMORY, INVALID_PARAM, RT_MEMORY_ALLOCATION, RT_PARAM_INVALID, Refused, api, need_int

NV12, NV21 = 1, 2  # PIXEL_FORMAT_YUV_SEMIPLANAR_420, PIXEL_FORMAT_YVU_SEMIPLANAR_420
H265_MAIN, H264_BASELINE, H264_MAIN, H264_HIGH = 0, 1, 2, 3  # acldvppStreamFormat
MODE_VPC, MODE_JPEGD, MODE_JPEGE = 1, 2, 4  # acldvppChannelMode
VDEC_CHANNEL_IDS = range(256)  # UNCONFIRMED for the 310P (newer docs 0..255, an old header 0..15)
RET_DECODE_FAILED = 1  # output ret_code when a send produced no picture (docs: 0 ok, 1 failed)
RET_OUTPUT_SIZE = 4  # AICPU_DVPP_KERNEL_STATE_OUTPUT_SIZE_INVALID
JPEG_CSS = {(2, 2): 2, (2, 1): 1, (1, 1): 0, (1, 2): 4, (4, 1): 5}  # acldvppJpegFormat (UNCONFIRMED values)
JPEG_CSS_GRAY, JPEG_CSS_UNKNOWN = 3, 1000


def _align(v: int, a: int) -> int:
    return (v + a - 1) // a * a


# -- objects ------------------------------------------------------------------------------------
@dataclass
class PicDesc:
    data: int = 0
    size: int = 0
    format: int = 0  # PIXEL_FORMAT_YUV_400 until set (UNCONFIRMED default)
    width: int = 0
    height: int = 0
    width_stride: int = 0
    height_stride: int = 0
    ret_code: int = 0
    owner: Any = None  # the VDEC channel holding it until the callback


@dataclass
class StreamDesc:
    data: int = 0
    size: int = 0
    format: int = 0
    timestamp: int = 0
    ret_code: int = 0
    eos: int = 0
    owner: Any = None


@dataclass
class DvppChannel:
    created: bool = False
    device: int | None = None
    mode: int = 0  # 0: every mode
    channel_id: int = 0


@dataclass
class Send:
    """One vdec_send_frame awaiting its picture/callback."""

    stream_desc: int
    pic_desc: int  # 0: skipped frame / EOS without output
    user_data: Any


@dataclass
class VdecChannel:
    channel_id: int = 0
    thread_id: int = 0
    callback: Any = None
    callback_set: bool = False
    entype: int = H265_MAIN  # UNCONFIRMED default
    out_pic_format: int = NV12  # the docs' default
    out_pic_width: int = 0
    out_pic_height: int = 0
    ref_frame_num: int = 0
    out_mode: int = 0
    bit_depth: int = 0
    created: bool = False
    device: int | None = None
    codec: Any = None
    pending: list = field(default_factory=list)  # Send, in send order
    outstanding: int = 0  # callbacks queued and not finished


class Callback:
    """A queued VDEC callback; run by acl.rt.process_report on the channel's thread."""

    def __init__(self, channel: VdecChannel, send: Send):
        self.channel, self.send = channel, send
        self.failed = ""

    def start(self, state) -> None:
        """Under the lock, just before the callback: the descriptions are the user's again."""
        for table, handle in ((state.media.stream_descs, self.send.stream_desc),
                              (state.media.pic_descs, self.send.pic_desc)):
            if handle in table:
                table[handle].owner = None

    def run(self) -> None:
        try:
            self.channel.callback(self.send.stream_desc, self.send.pic_desc, self.send.user_data)
        except Exception as exc:  # noqa: BLE001 -- pyACL logs it and goes on; the fake records it
            traceback.print_exc()
            self.failed = repr(exc)

    def finish(self, state) -> None:
        self.channel.outstanding -= 1
        state.media.count(self.channel.device, "vdec_callbacks")
        if self.failed:
            _fake.record(state, "acl.media.vdec callback", -1, f"the VDEC callback raised {self.failed}")


# -- memory -------------------------------------------------------------------------------------
@api("acl.media.dvpp_malloc", "value", default=0)
def dvpp_malloc(state, size):
    need_int(size)
    ctx = state.current_context()
    if size <= 0:
        raise Refused(RT_PARAM_INVALID, "dvpp_malloc of 0 bytes")
    device = state.contexts[ctx].device
    state.fault("acl.media.dvpp_malloc", device)
    rounded = _align(size, 128)
    if state.device_used[device] + rounded > DEVICE_MEMORY:
        raise Refused(RT_MEMORY_ALLOCATION, "device memory exhausted")
    state.device_used[device] += rounded
    region = state.add_region(rounded, "dvpp", device, requested=size, align=128)
    region.on_device = True
    state.media.count(device, "dvpp_mallocs")
    return region.ptr


@api("acl.media.dvpp_free", "ret")
def dvpp_free(state, ptr):
    need_int(ptr)
    if any(pic.owner is not None and pic.data == ptr for pic in state.media.pic_descs.values()):
        raise Refused(INVALID_PARAM, "dvpp_free of an output buffer VDEC still owns (before its callback)")
    state.free(ptr, "dvpp")


def live_thread(state, thread_id: int):
    """The running thread with this id: one of acl.util.start_thread's, or any other Python thread
    (a pthread id is all the card is given; threading.get_ident() is the pthread id on Linux)."""
    import threading

    worker = state.media.threads.get(thread_id)
    if worker is not None:
        return worker.thread if worker.alive() else None
    return next((t for t in threading.enumerate() if t.ident == thread_id and t.is_alive()), None)


def _dvpp_region(state, ptr: int, size: int, device: int | None, what: str):
    try:
        region = state.find(ptr, max(size, 1))
    except Refused:
        raise Refused(INVALID_PARAM, f"{what}: {ptr:#x} (+{size}) is not memory of this process") from None
    if region.kind != "dvpp":
        raise Refused(INVALID_PARAM, f"{what} must be acl.media.dvpp_malloc memory (it is {region.kind})")
    if region.device != device:
        raise Refused(INVALID_PARAM, f"{what} is dvpp memory of device {region.device}, not {device}")
    return region


def _nv12_view(state, pic: PicDesc, device: int | None, what: str) -> np.ndarray:
    """The picture's buffer as (height_stride * 3/2, width_stride) uint8."""
    need = pic.width_stride * pic.height_stride * 3 // 2
    region = _dvpp_region(state, pic.data, max(pic.size, need), device, what)
    return region.view(pic.data, need).reshape(pic.height_stride * 3 // 2, pic.width_stride)


# -- DVPP channels ------------------------------------------------------------------------------
@api("acl.media.dvpp_create_channel_desc", "bare", default=0)
def dvpp_create_channel_desc(state):
    handle = state.handle()
    state.media.channel_descs[handle] = DvppChannel()
    return handle


def _dvpp_channel(state, desc, created=True) -> DvppChannel:
    need_int(desc)
    channel = state.media.channel_descs.get(desc)
    if channel is None:
        raise Refused(INVALID_PARAM, "unknown dvpp channel description")
    if created and not channel.created:
        raise Refused(INVALID_PARAM, "the dvpp channel was not created (dvpp_create_channel)")
    return channel


@api("acl.media.dvpp_destroy_channel_desc", "ret")
def dvpp_destroy_channel_desc(state, desc):
    if _dvpp_channel(state, desc, created=False).created:
        raise Refused(INVALID_PARAM, "dvpp_destroy_channel before dvpp_destroy_channel_desc")
    del state.media.channel_descs[desc]


@api("acl.media.dvpp_set_channel_desc_mode", "ret")
def dvpp_set_channel_desc_mode(state, desc, mode):
    need_int(mode)
    channel = _dvpp_channel(state, desc, created=False)
    if channel.created or not 0 < mode <= MODE_VPC | MODE_JPEGD | MODE_JPEGE:
        raise Refused(INVALID_PARAM, f"channel mode {mode} (set before dvpp_create_channel)")
    channel.mode = mode


@api("acl.media.dvpp_get_channel_desc_channel_id", "bare", default=0)
def dvpp_get_channel_desc_channel_id(state, desc):
    return _dvpp_channel(state, desc, created=False).channel_id


@api("acl.media.dvpp_create_channel", "ret")
def dvpp_create_channel(state, desc):
    channel = _dvpp_channel(state, desc, created=False)
    ctx = state.current_context()
    if channel.created:
        raise Refused(INVALID_PARAM, "the dvpp channel is already created")
    channel.created, channel.device = True, state.contexts[ctx].device
    channel.channel_id = state.counts["acl.media.dvpp_create_channel"]
    state.media.count(channel.device, "dvpp_channels_created")


@api("acl.media.dvpp_destroy_channel", "ret")
def dvpp_destroy_channel(state, desc):
    channel = _dvpp_channel(state, desc)
    channel.created = False
    state.media.count(channel.device, "dvpp_channels_destroyed")


# -- picture descriptions -----------------------------------------------------------------------
@api("acl.media.dvpp_create_pic_desc", "bare", default=0)
def dvpp_create_pic_desc(state):
    handle = state.handle()
    state.media.pic_descs[handle] = PicDesc()
    return handle


def _pic(state, desc) -> PicDesc:
    need_int(desc)
    pic = state.media.pic_descs.get(desc)
    if pic is None:
        raise Refused(INVALID_PARAM, "unknown picture description")
    return pic


@api("acl.media.dvpp_destroy_pic_desc", "ret")
def dvpp_destroy_pic_desc(state, desc):
    if _pic(state, desc).owner is not None:
        raise Refused(INVALID_PARAM, "dvpp_destroy_pic_desc of a picture VDEC still owns (before its callback)")
    del state.media.pic_descs[desc]


def _pic_setter(attr):
    @api(f"acl.media.dvpp_set_pic_desc_{attr}", "ret")
    def setter(state, desc, value):
        need_int(value)
        pic = _pic(state, desc)
        if pic.owner is not None:
            raise Refused(INVALID_PARAM, "the picture belongs to VDEC until its callback")
        if value < 0 or value > 0xFFFFFFFF and attr != "data":
            raise OverflowError("unsigned int is greater than maximum" if value > 0 else "negative value")
        setattr(pic, attr, value)

    return setter


def _pic_getter(attr):
    @api(f"acl.media.dvpp_get_pic_desc_{attr}", "bare", default=0)
    def getter(state, desc):
        return getattr(_pic(state, desc), attr)

    return getter


dvpp_set_pic_desc_data = _pic_setter("data")
dvpp_set_pic_desc_size = _pic_setter("size")
dvpp_set_pic_desc_format = _pic_setter("format")
dvpp_set_pic_desc_width = _pic_setter("width")
dvpp_set_pic_desc_height = _pic_setter("height")
dvpp_set_pic_desc_width_stride = _pic_setter("width_stride")
dvpp_set_pic_desc_height_stride = _pic_setter("height_stride")
dvpp_set_pic_desc_ret_code = _pic_setter("ret_code")
dvpp_get_pic_desc_data = _pic_getter("data")
dvpp_get_pic_desc_size = _pic_getter("size")
dvpp_get_pic_desc_format = _pic_getter("format")
dvpp_get_pic_desc_width = _pic_getter("width")
dvpp_get_pic_desc_height = _pic_getter("height")
dvpp_get_pic_desc_width_stride = _pic_getter("width_stride")
dvpp_get_pic_desc_height_stride = _pic_getter("height_stride")
dvpp_get_pic_desc_ret_code = _pic_getter("ret_code")


# -- stream descriptions ------------------------------------------------------------------------
@api("acl.media.dvpp_create_stream_desc", "bare", default=0)
def dvpp_create_stream_desc(state):
    handle = state.handle()
    state.media.stream_descs[handle] = StreamDesc()
    return handle


def _sdesc(state, desc) -> StreamDesc:
    need_int(desc)
    sd = state.media.stream_descs.get(desc)
    if sd is None:
        raise Refused(INVALID_PARAM, "unknown stream description")
    return sd


@api("acl.media.dvpp_destroy_stream_desc", "ret")
def dvpp_destroy_stream_desc(state, desc):
    if _sdesc(state, desc).owner is not None:
        raise Refused(INVALID_PARAM, "dvpp_destroy_stream_desc of a stream VDEC still owns (before its callback)")
    del state.media.stream_descs[desc]


def _stream_setter(attr):
    @api(f"acl.media.dvpp_set_stream_desc_{attr}", "ret")
    def setter(state, desc, value):
        need_int(value)
        sd = _sdesc(state, desc)
        if sd.owner is not None:
            raise Refused(INVALID_PARAM, "the stream description belongs to VDEC until its callback")
        if attr == "eos" and not 0 <= value <= 255:
            raise OverflowError("unsigned byte integer is out of range")
        setattr(sd, attr, value)

    return setter


def _stream_getter(attr):
    @api(f"acl.media.dvpp_get_stream_desc_{attr}", "bare", default=0)
    def getter(state, desc):
        return getattr(_sdesc(state, desc), attr)

    return getter


dvpp_set_stream_desc_data = _stream_setter("data")
dvpp_set_stream_desc_size = _stream_setter("size")
dvpp_set_stream_desc_format = _stream_setter("format")
dvpp_set_stream_desc_timestamp = _stream_setter("timestamp")
dvpp_set_stream_desc_ret_code = _stream_setter("ret_code")
dvpp_set_stream_desc_eos = _stream_setter("eos")
dvpp_get_stream_desc_data = _stream_getter("data")
dvpp_get_stream_desc_size = _stream_getter("size")
dvpp_get_stream_desc_format = _stream_getter("format")
dvpp_get_stream_desc_timestamp = _stream_getter("timestamp")
dvpp_get_stream_desc_ret_code = _stream_getter("ret_code")
dvpp_get_stream_desc_eos = _stream_getter("eos")


# -- roi and resize configs ---------------------------------------------------------------------
@api("acl.media.dvpp_create_roi_config", "bare", default=0)
def dvpp_create_roi_config(state, left, right, top, bottom):
    need_int(left, right, top, bottom)
    handle = state.handle()
    state.media.roi_configs[handle] = [left, right, top, bottom]
    return handle


def _roi(state, cfg) -> list:
    need_int(cfg)
    roi = state.media.roi_configs.get(cfg)
    if roi is None:
        raise Refused(INVALID_PARAM, "unknown roi config")
    return roi


@api("acl.media.dvpp_destroy_roi_config", "ret")
def dvpp_destroy_roi_config(state, cfg):
    _roi(state, cfg)
    del state.media.roi_configs[cfg]


@api("acl.media.dvpp_set_roi_config", "ret")
def dvpp_set_roi_config(state, cfg, left, right, top, bottom):
    need_int(left, right, top, bottom)
    _roi(state, cfg)[:] = [left, right, top, bottom]


def _roi_setter(index, side):
    @api(f"acl.media.dvpp_set_roi_config_{side}", "ret")
    def setter(state, cfg, value):
        need_int(value)
        _roi(state, cfg)[index] = value

    return setter


dvpp_set_roi_config_left = _roi_setter(0, "left")
dvpp_set_roi_config_right = _roi_setter(1, "right")
dvpp_set_roi_config_top = _roi_setter(2, "top")
dvpp_set_roi_config_bottom = _roi_setter(3, "bottom")


@api("acl.media.dvpp_create_resize_config", "bare", default=0)
def dvpp_create_resize_config(state):
    handle = state.handle()
    state.media.resize_configs[handle] = 0
    return handle


def _resize_cfg(state, cfg) -> int:
    need_int(cfg)
    if cfg not in state.media.resize_configs:
        raise Refused(INVALID_PARAM, "unknown resize config")
    return state.media.resize_configs[cfg]


@api("acl.media.dvpp_destroy_resize_config", "ret")
def dvpp_destroy_resize_config(state, cfg):
    _resize_cfg(state, cfg)
    del state.media.resize_configs[cfg]


@api("acl.media.dvpp_set_resize_config_interpolation", "ret")
def dvpp_set_resize_config_interpolation(state, cfg, interpolation):
    need_int(interpolation)
    _resize_cfg(state, cfg)
    if not 0 <= interpolation <= 4:  # UNCONFIRMED which of 0..4 the 310P VPC accepts
        raise Refused(INVALID_PARAM, f"interpolation {interpolation}")
    state.media.resize_configs[cfg] = interpolation


@api("acl.media.dvpp_get_resize_config_interpolation", "bare", default=0)
def dvpp_get_resize_config_interpolation(state, cfg):
    return _resize_cfg(state, cfg)


from .media_ops import (  # noqa: E402,F401  (JPEGD, VPC and VDEC are public names of this module)
    dvpp_jpeg_decode_async, dvpp_jpeg_get_image_info, dvpp_jpeg_get_image_info_v2, dvpp_jpeg_predict_dec_size,
    dvpp_vpc_crop_and_paste_async, dvpp_vpc_crop_async, dvpp_vpc_crop_resize_async, dvpp_vpc_resize_async)
from .vdec import (  # noqa: E402,F401
    vdec_create_channel, vdec_create_channel_desc, vdec_create_frame_config, vdec_destroy_channel,
    vdec_destroy_channel_desc, vdec_destroy_frame_config, vdec_get_channel_desc_bit_depth,
    vdec_get_channel_desc_callback, vdec_get_channel_desc_channel_id, vdec_get_channel_desc_entype,
    vdec_get_channel_desc_out_mode, vdec_get_channel_desc_out_pic_format, vdec_get_channel_desc_out_pic_height,
    vdec_get_channel_desc_out_pic_width, vdec_get_channel_desc_ref_frame_num, vdec_get_channel_desc_thread_id,
    vdec_send_frame, vdec_send_skipped_frame, vdec_set_channel_desc_bit_depth, vdec_set_channel_desc_callback,
    vdec_set_channel_desc_channel_id, vdec_set_channel_desc_entype, vdec_set_channel_desc_out_mode,
    vdec_set_channel_desc_out_pic_format, vdec_set_channel_desc_out_pic_height,
    vdec_set_channel_desc_out_pic_width, vdec_set_channel_desc_ref_frame_num, vdec_set_channel_desc_thread_id)

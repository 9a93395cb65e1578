"""JPEGD and VPC of the fake `acl.media` (the rules are in media.py's docstring). Kept apart from
the descriptor bookkeeping so each file stays readable; the public names are media's."""

from __future__ import annotations

import struct

import numpy as np

from ._fake import INVALID_PARAM, Refused, api, need_int
from .media import (JPEG_CSS, JPEG_CSS_GRAY, JPEG_CSS_UNKNOWN, MODE_JPEGD, MODE_VPC, NV12, NV21, PicDesc, _align,
                    _dvpp_channel, _dvpp_region, _nv12_view, _pic, _resize_cfg, _roi)
from .rt import _own_stream


# -- JPEG header --------------------------------------------------------------------------------
def _jpeg_header(data: bytes) -> tuple[int, int, int, int]:
    """(width, height, components, acldvppJpegFormat) from the SOF marker; a non-JPEG is refused."""
    if data[:2] != b"\xff\xd8":
        raise Refused(INVALID_PARAM, "not a JPEG (no SOI marker)")
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            i += 1
            continue
        marker = data[i + 1]
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7 or marker == 0xFF:
            i += 1 if marker == 0xFF else 2
            continue
        (length,) = struct.unpack(">H", data[i + 2:i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            height, width = struct.unpack(">HH", data[i + 5:i + 9])
            comps = data[i + 9]
            if comps == 1:
                css = JPEG_CSS_GRAY
            else:
                factors = data[i + 11]
                css = JPEG_CSS.get((factors >> 4, factors & 0xF), JPEG_CSS_UNKNOWN)
            return width, height, comps, css
        i += 2 + length
    raise Refused(INVALID_PARAM, "no SOF marker in the JPEG")


def _host_bytes(state, ptr: int, size: int) -> bytes:
    need_int(ptr, size)
    if size <= 0:
        raise Refused(INVALID_PARAM, "JPEG size 0")
    return state.find(ptr, size).view(ptr, size).tobytes()


@api("acl.media.dvpp_jpeg_get_image_info", "value3", default=0)
def dvpp_jpeg_get_image_info(state, data, size):
    width, height, comps, _css = _jpeg_header(_host_bytes(state, data, size))
    return width, height, comps


@api("acl.media.dvpp_jpeg_get_image_info_v2", "value4", default=0)
def dvpp_jpeg_get_image_info_v2(state, data, size):
    return _jpeg_header(_host_bytes(state, data, size))


def _jpegd_strides(state, width: int, height: int) -> tuple[int, int]:
    return _align(width, 64 if state.soc == "Ascend310P3" else 128), _align(height, 16)


@api("acl.media.dvpp_jpeg_predict_dec_size", "value", default=0)
def dvpp_jpeg_predict_dec_size(state, data, size, fmt):
    need_int(fmt)
    width, height, _c, _css = _jpeg_header(_host_bytes(state, data, size))
    if fmt not in (NV12, NV21):
        raise Refused(INVALID_PARAM, f"JPEGD output format {fmt} (the fake decodes to YUV420SP only)")
    ws, hs = _jpegd_strides(state, width, height)
    return ws * hs * 3 // 2  # UNCONFIRMED: the card may ask for a little more


def _decode_jpeg(data: bytes):
    """The JPEG's own Y, U, V planes (4:2:0), as FFmpeg's MJPEG decoder gives them."""
    import av

    codec = av.CodecContext.create("mjpeg", "r")
    frames = codec.decode(av.Packet(data))
    if not frames:
        raise ValueError("no picture")
    frame = frames[0]
    if frame.format.name not in ("yuvj420p", "yuv420p"):
        frame = frame.reformat(format="yuvj420p")
    planes = []
    for k, plane in enumerate(frame.planes):
        w, h = (frame.width, frame.height) if k == 0 else ((frame.width + 1) // 2, (frame.height + 1) // 2)
        arr = np.frombuffer(plane, np.uint8).reshape(-1, plane.line_size)[:h, :w]
        planes.append(arr)
    return planes


def _write_yuv(view: np.ndarray, hs: int, planes, fmt: int) -> None:
    y, u, v = planes
    h, w = y.shape
    view[:h, :w] = y
    uv = np.stack((u, v) if fmt == NV12 else (v, u), axis=-1).reshape(u.shape[0], -1)
    view[hs:hs + uv.shape[0], :uv.shape[1]] = uv


@api("acl.media.dvpp_jpeg_decode_async", "ret")
def dvpp_jpeg_decode_async(state, channel_desc, data, size, output_desc, stream):
    need_int(data, size, output_desc)
    channel = _dvpp_channel(state, channel_desc)
    s = _own_stream(state, stream)
    if channel.mode and not channel.mode & MODE_JPEGD:
        raise Refused(INVALID_PARAM, "the channel's mode excludes JPEGD")
    region = _dvpp_region(state, data, size, channel.device, "the JPEG input")
    jpeg = region.view(data, size).tobytes()
    width, height, _c, _css = _jpeg_header(jpeg)
    pic = _pic(state, output_desc)
    if pic.format not in (NV12, NV21):
        raise Refused(INVALID_PARAM, f"JPEGD output format {pic.format} (the fake decodes to YUV420SP only)")
    ws, hs = _jpegd_strides(state, width, height)
    align_w = 64 if state.soc == "Ascend310P3" else 128
    if pic.width_stride % align_w or pic.width_stride < ws or pic.height_stride % 16 or pic.height_stride < hs:
        raise Refused(INVALID_PARAM, f"JPEGD output strides {pic.width_stride}x{pic.height_stride} for a "
                                     f"{width}x{height} JPEG: need multiples of {align_w}x16, at least {ws}x{hs}")
    need = pic.width_stride * pic.height_stride * 3 // 2
    if pic.size < need:
        raise Refused(INVALID_PARAM, f"JPEGD output size {pic.size} < {need}")
    view = _nv12_view(state, pic, channel.device, "the JPEGD output")
    fmt, out_hs, device = pic.format, pic.height_stride, channel.device

    def task():
        try:
            planes = _decode_jpeg(jpeg)
        except (ValueError, OSError) as exc:  # av.error.* derive from OSError/ValueError
            state.errors.append(("acl.media.dvpp_jpeg_decode_async (on the stream)", INVALID_PARAM))
            state.refusals.append(("acl.media.dvpp_jpeg_decode_async (on the stream)", INVALID_PARAM, str(exc)))
            return INVALID_PARAM
        _write_yuv(view, out_hs, planes, fmt)
        pic.width, pic.height = width, height  # UNCONFIRMED that JPEGD writes them back
        state.media.count(device, "jpegd")
        return 0

    s.pending.append(task)


# -- VPC ----------------------------------------------------------------------------------------
def _vpc_pic(state, desc, device, what) -> tuple[PicDesc, np.ndarray]:
    pic = _pic(state, desc)
    if pic.format not in (NV12, NV21):
        raise Refused(INVALID_PARAM, f"{what}: format {pic.format}, the fake VPC takes YUV420SP (NV12/NV21)")
    if pic.width <= 0 or pic.height <= 0 or pic.width_stride < pic.width or pic.height_stride < pic.height:
        raise Refused(INVALID_PARAM, f"{what}: {pic.width}x{pic.height} in strides "
                                     f"{pic.width_stride}x{pic.height_stride}")
    if pic.width_stride % 16 or pic.height_stride % 2:
        raise Refused(INVALID_PARAM, f"{what}: strides {pic.width_stride}x{pic.height_stride} "
                                     "must be multiples of 16x2")
    need = pic.width_stride * pic.height_stride * 3 // 2
    if pic.size < need:
        raise Refused(INVALID_PARAM, f"{what}: size {pic.size} < {need}")
    return pic, _nv12_view(state, pic, device, what)


def _area(state, cfg, pic: PicDesc, what: str, paste=False) -> tuple[int, int, int, int]:
    left, right, top, bottom = _roi(state, cfg)
    if left % 2 or top % 2 or right % 2 == 0 or bottom % 2 == 0:
        raise Refused(INVALID_PARAM, f"{what} {left, right, top, bottom}: left/top even, right/bottom odd")
    if not (left < right < pic.width and top < bottom < pic.height):
        raise Refused(INVALID_PARAM, f"{what} {left, right, top, bottom} outside the {pic.width}x{pic.height} picture")
    if paste and left % 16:
        raise Refused(INVALID_PARAM, f"{what} left edge {left} is not a multiple of 16")
    return left, right, top, bottom


def _whole(pic: PicDesc) -> tuple[int, int, int, int]:
    return 0, pic.width - pic.width % 2 - 1, 0, pic.height - pic.height % 2 - 1


def _vpc(state, name, channel_desc, input_desc, output_desc, crop_cfg, paste_cfg, resize_cfg, stream) -> None:
    channel = _dvpp_channel(state, channel_desc)
    s = _own_stream(state, stream)
    if channel.mode and not channel.mode & MODE_VPC:
        raise Refused(INVALID_PARAM, "the channel's mode excludes VPC")
    if resize_cfg is not None:
        _resize_cfg(state, resize_cfg)
    src, src_view = _vpc_pic(state, input_desc, channel.device, "the VPC input")
    dst, dst_view = _vpc_pic(state, output_desc, channel.device, "the VPC output")
    crop = _whole(src) if crop_cfg is None else _area(state, crop_cfg, src, "crop area")
    paste = _whole(dst) if paste_cfg is None else _area(state, paste_cfg, dst, "paste area", paste=True)
    cw, ch = crop[1] - crop[0] + 1, crop[3] - crop[2] + 1
    pw, ph = paste[1] - paste[0] + 1, paste[3] - paste[2] + 1
    for a, b in ((pw, cw), (ph, ch)):
        if not 1 / 32 <= a / b <= 16:
            raise Refused(INVALID_PARAM, f"scale {pw}/{cw} x {ph}/{ch}: VPC scales between 1/32 and 16")
    job = (src_view, src.height_stride, src.format, dst_view, dst.height_stride, dst.format, crop, paste)

    def task():
        _crop_resize_paste(*job)
        state.media.count(channel.device, "vpc")
        return 0

    s.pending.append(task)


def _crop_resize_paste(src, src_hs, src_fmt, dst, dst_hs, dst_fmt, crop, paste) -> None:
    import cv2

    left, right, top, bottom = crop
    pl, pr, pt, pb = paste
    pw, ph = pr - pl + 1, pb - pt + 1
    y = np.ascontiguousarray(src[top:bottom + 1, left:right + 1])
    src_uv = src[src_hs:].reshape(src_hs // 2, -1, 2)
    uv = np.ascontiguousarray(src_uv[top // 2:(bottom + 1) // 2, left // 2:(right + 1) // 2])
    if src_fmt != dst_fmt:
        uv = uv[..., ::-1].copy()
    dst[pt:pb + 1, pl:pr + 1] = cv2.resize(y, (pw, ph), interpolation=cv2.INTER_LINEAR)
    dst_uv = dst[dst_hs:].reshape(dst_hs // 2, -1, 2)
    dst_uv[pt // 2:(pb + 1) // 2, pl // 2:(pr + 1) // 2] = cv2.resize(uv, (pw // 2, ph // 2),
                                                                       interpolation=cv2.INTER_LINEAR)


@api("acl.media.dvpp_vpc_resize_async", "ret")
def dvpp_vpc_resize_async(state, channel_desc, input_desc, output_desc, resize_config, stream):
    _vpc(state, "resize", channel_desc, input_desc, output_desc, None, None, resize_config, stream)


@api("acl.media.dvpp_vpc_crop_async", "ret")
def dvpp_vpc_crop_async(state, channel_desc, input_desc, output_desc, crop_area, stream):
    _vpc(state, "crop", channel_desc, input_desc, output_desc, crop_area, None, None, stream)


@api("acl.media.dvpp_vpc_crop_resize_async", "ret")
def dvpp_vpc_crop_resize_async(state, channel_desc, input_desc, output_desc, crop_area, resize_config, stream):
    _vpc(state, "crop_resize", channel_desc, input_desc, output_desc, crop_area, None, resize_config, stream)


@api("acl.media.dvpp_vpc_crop_and_paste_async", "ret")
def dvpp_vpc_crop_and_paste_async(state, channel_desc, input_desc, output_desc, crop_area, paste_area, stream):
    _vpc(state, "crop_and_paste", channel_desc, input_desc, output_desc, crop_area, paste_area, None, stream)

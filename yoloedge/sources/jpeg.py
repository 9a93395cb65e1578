"""Decoding the JPEGs of MJPEG cameras and image folders, on the GPU where a decoder is installed.

A camera chooses with `jpeg_decoder: auto | nvimgcodec | nvjpeg | cpu` (default auto; the values,
modules and install hints are the config's, `config.sources`):

* `nvimgcodec` -- NVIDIA nvImageCodec (`from nvidia import nvimgcodec`; pip packages
  nvidia-nvimgcodec-cu12 / -cu13, Jetson: nvidia-nvimgcodec-tegra-cu12): maintained, x86 and Jetson;
* `nvjpeg` -- pynvjpeg (`import nvjpeg`), the older binding: builds from source, unmaintained;
* `cpu` -- OpenCV (libjpeg-turbo), what every camera used before;
* `auto` -- the first of these that is installed and starts, so a box without a GPU stack
  reads its cameras exactly as before.

Every decoder hands out what OpenCV hands out -- a uint8 BGR array of H x W x 3 in host memory, the
image's EXIF orientation applied -- so nothing after the source can tell them apart. A JPEG a GPU
decoder refuses (corrupt, or a variant it does not support, such as arithmetic coding) is given to
OpenCV: a corrupt frame then fails there and is skipped like any unreadable frame, and a
legitimate one still decodes. The pixel bound is checked on the header before any decoder runs
(`imagesize.decode_image`).

A decoder belongs to one source and is used by one thread (the camera's connection thread): the
thread safety of both GPU bindings is undocumented.
"""

from __future__ import annotations

import importlib
import logging
import struct
from types import ModuleType
from typing import Protocol

import cv2
import numpy as np

from ..config.sources import INSTALL_HINTS, MODULES, JpegDecoderKind, jpeg_decoder_installed
from ..errors import YoloedgeError
from .imagesize import DEFAULT_LIMITS, ImageLimits, cv2_decode, decode_image, read_bounded

log = logging.getLogger(__name__)


#: what `auto` tries, best first
AUTO_ORDER = (JpegDecoderKind.NVIMGCODEC, JpegDecoderKind.NVJPEG)
_SOI = b"\xff\xd8\xff"


class JpegDecoderUnavailable(YoloedgeError):
    """The requested decoder's library would not start (no GPU, no CUDA): it may another time."""


class JpegDecoderMissing(JpegDecoderUnavailable):
    """The requested decoder is not installed: retrying cannot help."""


class JpegDecoder(Protocol):
    """Decodes one JPEG into a uint8 BGR H x W x 3 host array, as cv2.imdecode(IMREAD_COLOR) does.
    Raises ImageError (its message without a path) for data that no decoder can read."""

    kind: JpegDecoderKind

    def decode(self, data: bytes) -> np.ndarray: ...


class CpuJpegDecoder:
    kind = JpegDecoderKind.CPU

    def decode(self, data: bytes) -> np.ndarray:
        return cv2_decode(data)


class _GpuDecoder:
    """What both GPU decoders share: OpenCV for what they refuse or cannot do the same way."""

    kind: JpegDecoderKind

    def __init__(self) -> None:
        self.fallbacks = 0  # JPEGs the GPU refused, given to OpenCV
        self._warned = False

    def decode(self, data: bytes) -> np.ndarray:
        if exif_orientation(data) not in (None, 1) and not self._applies_orientation():
            return cv2_decode(data)  # OpenCV turns the image as EXIF says; this decoder would not
        try:
            return self._decode(data)
        except _GpuRefused as exc:
            return self._fall_back(data, str(exc))

    def _fall_back(self, data: bytes, why: str) -> np.ndarray:
        self.fallbacks += 1
        level = logging.DEBUG if self._warned else logging.WARNING
        self._warned = True
        log.log(level, "%s could not decode a JPEG (%s); decoding it with OpenCV", self.kind.value, why)
        return cv2_decode(data)

    def _applies_orientation(self) -> bool:
        return False

    def _decode(self, data: bytes) -> np.ndarray:
        raise NotImplementedError


class _GpuRefused(Exception):
    """A GPU decoder did not decode one image; OpenCV gets a try."""


class NvImageCodecDecoder(_GpuDecoder):
    """nvImageCodec: `Decoder().decode(bytes)` decodes on the GPU (its nvJPEG hardware or CUDA
    back-end, falling back to its own CPU codecs) into device memory; `.cpu()` copies the image to
    host memory, where `__array_interface__` lets numpy read it.

    API facts (nvImageCodec's Python bindings, python/decoder.cpp, image.cpp, decode_params.cpp,
    code_stream.cpp): the default DecodeParams decode to interleaved sRGB -- RGB order, 3
    channels, also for a grey JPEG -- uint8, with the EXIF orientation applied
    (apply_exif_orientation=True); decode() returns None when decoding failed (it logs a warning
    itself); data it cannot parse fails while the bytes become a CodeStream ("Failed to create
    code stream", a C++ runtime_error, so RuntimeError in Python; pybind11 reports a failed
    implicit bytes->DecodeSource conversion as TypeError -- which of the two a given release
    raises is UNCONFIRMED, so both are caught). `cpu()` returns None if the copy could not be
    done. The Decoder's default options (":fancy_upsampling=0") upsample chroma differently from
    libjpeg-turbo's default, so pixels may differ from OpenCV's by a few levels (UNCONFIRMED on
    hardware: the prepared GPU check measures it). Thread safety of one Decoder: UNCONFIRMED.
    """

    kind = JpegDecoderKind.NVIMGCODEC

    def __init__(self, module: ModuleType):
        super().__init__()
        self._decoder = module.Decoder()

    def _applies_orientation(self) -> bool:
        return True

    def _decode(self, data: bytes) -> np.ndarray:
        try:
            image = self._decoder.decode(data)
        except (RuntimeError, TypeError) as exc:
            raise _GpuRefused(_one_line(exc)) from None
        if image is None:
            raise _GpuRefused("nvImageCodec decoded no image")
        host = image.cpu()
        if host is None:
            raise _GpuRefused("nvImageCodec could not copy the image to host memory")
        rgb = np.asarray(host)  # a view of the host Image's buffer (it stays alive as the base)
        if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.dtype != np.uint8:
            raise _GpuRefused(f"nvImageCodec returned {rgb.dtype} {rgb.shape}, not uint8 H x W x 3")
        return cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)  # a new array: nothing refers to the Image after


class NvJpegDecoder(_GpuDecoder):
    """pynvjpeg: `NvJpeg().decode(bytes)` returns a uint8 BGR H x W x 3 numpy array that owns its
    memory (nvJPEG's BGRI output copied to the host); a decode error raises ValueError ("NvJpeg
    Decoder Error, Code: N"). It does not read EXIF, so an image with an orientation tag goes to
    OpenCV, which turns it. Thread safety: the handle re-binds to the calling thread, no locking
    (UNCONFIRMED whether concurrent use is safe; one decoder per camera avoids the question).
    """

    kind = JpegDecoderKind.NVJPEG

    def __init__(self, module: ModuleType):
        super().__init__()
        self._nvjpeg = module.NvJpeg()

    def _decode(self, data: bytes) -> np.ndarray:
        try:
            image = self._nvjpeg.decode(data)
        except ValueError as exc:
            raise _GpuRefused(_one_line(exc)) from None
        if not isinstance(image, np.ndarray) or image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise _GpuRefused("pynvjpeg returned no uint8 H x W x 3 image")
        return image


_IMPLEMENTATIONS = {JpegDecoderKind.NVIMGCODEC: NvImageCodecDecoder, JpegDecoderKind.NVJPEG: NvJpegDecoder}


def choose(requested: str | JpegDecoderKind) -> JpegDecoder:
    """The decoder a camera uses. `auto` takes the first GPU decoder that is installed and starts
    (saying in the log why one that is installed did not), else OpenCV. An explicit GPU decoder
    that is missing or does not start raises JpegDecoderUnavailable naming what to install."""
    kind = JpegDecoderKind(requested)
    if kind is JpegDecoderKind.CPU:
        return CpuJpegDecoder()
    if kind is JpegDecoderKind.AUTO:
        for candidate in AUTO_ORDER:
            if not jpeg_decoder_installed(candidate):
                continue
            try:
                return start(candidate)
            except JpegDecoderUnavailable as exc:
                log.warning("jpeg_decoder auto: %s; trying the next decoder", exc)
        return CpuJpegDecoder()
    if not jpeg_decoder_installed(kind):
        raise JpegDecoderMissing(f"jpeg_decoder {kind.value}: {MODULES[kind]} is not installed: "
                                     f"{INSTALL_HINTS[kind]}, or use jpeg_decoder: auto")
    return start(kind)


def start(kind: JpegDecoderKind) -> JpegDecoder:
    """Import the GPU decoder's module and create its decoder (this starts CUDA)."""
    try:
        module = importlib.import_module(MODULES[kind])
        return _IMPLEMENTATIONS[kind](module)
    except Exception as exc:  # noqa: BLE001 - any failure of a binding to start: reported with its text
        raise JpegDecoderUnavailable(f"{kind.value} did not start: {type(exc).__name__}: "
                                     f"{_one_line(exc)}") from None


def is_jpeg(data: bytes) -> bool:
    return data[:3] == _SOI


def decode(data: bytes, label: str, decoder: JpegDecoder, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """`data` decoded: JPEGs by `decoder`, other formats by OpenCV; the header's pixel bound first.
    Errors (ImageError, ImageTooLarge) start with `label`."""
    chosen = decoder.decode if is_jpeg(data) and decoder.kind is not JpegDecoderKind.CPU else None
    return decode_image(data, label, limits, chosen)


def read_image(path: str, decoder: JpegDecoder, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """`imagesize.read_image` with `decoder` for JPEG files."""
    return decode(read_bounded(path, limits.max_bytes), path, decoder, limits)


# -- EXIF orientation ------------------------------------------------------------------------------

_EXIF = b"Exif\x00\x00"
_ORIENTATION_TAG = 0x0112


def exif_orientation(data: bytes) -> int | None:
    """The EXIF orientation (1-8) of a JPEG, or None when it has none (or it cannot be read): the
    APP1 `Exif` segment's first IFD, tag 0x0112. Only the segments before the scan are looked at."""
    if not is_jpeg(data):
        return None
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        if data[at + 1] == 0xFF:  # a fill byte: any marker may be preceded by any number of them
            at += 1
            continue
        marker = data[at + 1]
        if marker == 0xDA or 0xD0 <= marker <= 0xD9:  # the scan, or no segment with a length
            return None
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if marker == 0xE1 and data[at + 4:at + 10] == _EXIF:
            try:
                return _tiff_orientation(data[at + 10:at + 2 + length])
            except (struct.error, IndexError):
                return None
        at += 2 + length
    return None


def _tiff_orientation(tiff: bytes) -> int | None:
    order = "<" if tiff[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(order + "I", tiff, 4)
    (count,) = struct.unpack_from(order + "H", tiff, ifd)
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind = struct.unpack_from(order + "HH", tiff, entry)
        if tag == _ORIENTATION_TAG and kind == 3:  # SHORT
            (value,) = struct.unpack_from(order + "H", tiff, entry + 8)
            return int(value) if 1 <= value <= 8 else None
    return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__

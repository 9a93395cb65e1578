"""I420 pictures (a GStreamer buffer, a PyAV frame's planes) into BGR arrays, bit for bit as OpenCV's
FFmpeg makes them.

`decoder: opencv` gets its BGR from FFmpeg's swscale (yuv420p to bgr24 at the same size: swscale's
"unscaled" converter, whatever flags OpenCV passes). The GStreamer presets and `decoder: pyav` hand
Python the decoder's I420 (or NV12: the same samples, U and V interleaved) instead, and this module
computes what swscale would have made of it: the same row
of swscale's coefficient table, the same fixed-point arithmetic, each chroma sample repeated over
its 2x2 block. Anything else moves an int8 model's scores: cv2.cvtColor's COLOR_YUV2BGR_I420 rounds
its own way (about one grey level brighter on average), GStreamer's videoconvert interpolates
chroma; either changed the boxes of most frames of a crowded clip.

swscale has two arithmetics for this conversion, and each is reproduced (`Arithmetic`):
- x86 (yuv_2_rgb.asm, SSSE3): every sample times 8, 16-bit multiplies that keep the high half
  (pmulhw), B = Y' + U'ub, G = Y' + U'ug + V'vg, R = Y' + V'vr, saturated to 0..255.
- elsewhere (yuv2rgb.c, the C converter; aarch64 has no NEON one for BGR24): a clipped luma table
  read at Y plus an offset per chroma sample.
Both are a 16-bit term per Y, per U and per V (lookup tables, `swscale_tables`), added per pixel,
then clipped (x86) or looked up in the luma table (C). Both were checked against FFmpeg's own
converters (called on libswscale) for every (Y, U, V) in every matrix and range.

Which matrix and range OpenCV's FFmpeg applies depends on OpenCV (`opencv_colorimetry`): OpenCV 5
(FFmpeg 8) takes the stream's matrix and range; OpenCV 4 takes the range but always BT.601.

Not reproduced (`opencv_differences`; the sources say so once per stream): odd heights, which swscale sends through
its general scaler (chroma interpolated vertically, about one grey level off on average), and, with
OpenCV 5, wide-gamut primaries (BT.2020, DCI-P3...) and HDR transfers (PQ, HLG), which FFmpeg 8
maps to BT.709 before converting.

The picture is converted in strips of about STRIP_PIXELS pixels (whole rows, an even number), into
arrays kept for the next frame: the 16-bit intermediates of a whole 1080p frame would take 27 MB per
camera, a strip's 0.9 MB. Strips of 32 rows at 1080p convert as fast as strips of 84 (16.3 and
16.8 ms a frame on a loaded 2-core x86 VM; their intermediates stay in the cache), 16 rows took
21 ms, 8 rows 30 ms (Python's calls per strip).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from enum import Enum
from typing import Any

import cv2
import numpy as np

from .framepool import allocate

#: pixels converted at a time, about 13 bytes of intermediates each (the rows of a strip are even in
#: number: a strip holds whole 2x2 chroma blocks)
STRIP_PIXELS = 1920 * 32


def strip_rows(width: int) -> int:
    """How many rows of a picture `width` wide a strip holds."""
    return max(2, STRIP_PIXELS // max(width, 1) // 2 * 2)


@dataclass(frozen=True)
class PlaneLayout:
    """Where a picture's planes lie in its buffer: their byte offsets and row strides (one entry
    per plane: one for BGR, Y/U/V for I420)."""

    width: int
    height: int
    offsets: tuple[int, ...]
    strides: tuple[int, ...]


class Matrix(str, Enum):
    """The YUV-to-RGB matrices swscale knows (its SWS_CS_* table rows)."""

    BT601 = "bt601"  # also BT.470BG, SMPTE 170M, and swscale's default for an unstated matrix
    BT709 = "bt709"
    FCC = "fcc"
    SMPTE240M = "smpte240m"
    BT2020 = "bt2020"


#: swscale's inverse coefficients (crv, cbu, cgu, cgv), 16.16 fixed point: ff_yuv2rgb_coeffs in
#: libswscale/yuv2rgb.c, the rows sws_getCoefficients gives for each matrix
SWS_COEFFICIENTS: dict[Matrix, tuple[int, int, int, int]] = {
    Matrix.BT601: (104597, 132201, 25675, 53279),
    Matrix.BT709: (117489, 138438, 13975, 34925),
    Matrix.FCC: (104448, 132798, 24759, 53109),
    Matrix.SMPTE240M: (117579, 136230, 16907, 35559),
    Matrix.BT2020: (110013, 140363, 12277, 42626),
}


@dataclass(frozen=True)
class Colorimetry:
    """How a picture's YUV maps to RGB: the matrix, and full (0..255) or limited (16..235) range."""

    matrix: Matrix = Matrix.BT601
    full_range: bool = False


BT601 = Colorimetry()


def opencv_reads_tags(cv2_version: str = cv2.__version__) -> bool:
    """Whether cv2.VideoCapture converts a frame by its own tags. OpenCV 5 hands FFmpeg 8 the
    decoded frame (sws_scale_frame): the stream's matrix and range apply, and wide-gamut primaries
    and HDR transfers are mapped to BT.709. OpenCV 4 sets swscale up with its defaults
    (sws_getCachedContext): BT.601 whatever the stream says, and the range of the decoder's pixel
    format (FFmpeg's decoders give full-range streams as yuvj420p). Measured with
    opencv-python-headless 4.12.0.88 (FFmpeg 5.1) and 5.0.0.93 (FFmpeg 8.0)."""
    return int(cv2_version.split(".", 1)[0]) >= 5


def opencv_colorimetry(stream: Colorimetry, cv2_version: str = cv2.__version__) -> Colorimetry:
    """The conversion cv2.VideoCapture applies to a stream that states `stream` (BT.601 limited
    where it states nothing)."""
    return stream if opencv_reads_tags(cv2_version) else Colorimetry(Matrix.BT601, stream.full_range)


def opencv_differences(height: int, colour_managed: str | None) -> list[str]:
    """Why a stream's pictures converted here differ from cv2.VideoCapture's (empty: they do not):
    an odd `height`, and with OpenCV 5 what `colour_managed` names (wide-gamut primaries, an HDR
    transfer), or None."""
    reasons = []
    if height % 2:
        reasons.append(f"its height ({height}) is odd: OpenCV's FFmpeg interpolates chroma between "
                       f"rows there, yoloedge repeats it (about 1 grey level apart on average)")
    if colour_managed is not None and opencv_reads_tags():
        reasons.append(f"its {colour_managed}: OpenCV's FFmpeg maps such colours to BT.709 first, which "
                       f"yoloedge does not")
    return reasons


class Arithmetic(str, Enum):
    """Which of swscale's two yuv420p-to-bgr24 converters a machine's FFmpeg runs."""

    X86 = "x86"  # the SSSE3 one (yuv_2_rgb.asm): x86 CPUs (SSSE3: Intel since 2006, AMD since 2011)
    C = "c"  # the portable one (yuv2rgb.c): aarch64 (Jetson, Ascend hosts) and the rest


def native_arithmetic(machine: str | None = None) -> Arithmetic:
    """The converter FFmpeg uses on this machine (or on `machine`, platform.machine()'s name)."""
    name = (platform.machine() if machine is None else machine).lower()
    return Arithmetic.X86 if name in ("x86_64", "amd64", "i386", "i686", "x86") else Arithmetic.C


@dataclass(frozen=True)
class Tables:
    """One conversion as lookup tables: each output channel is `luma[Y]` plus its chroma terms
    (blue: `blue_u[U]`; green: `green_u[U] + green_v[V]`; red: `red_v[V]`), 16-bit, clipped to
    0..255, then (the C converter) read in `final`."""

    luma: np.ndarray
    blue_u: np.ndarray
    green_u: np.ndarray
    green_v: np.ndarray
    red_v: np.ndarray
    final: np.ndarray | None  # None: the clipped sum is the picture (x86)


def _c_div(a: int, b: int) -> int:
    """C's integer division (truncates towards zero), which swscale's table set-up uses."""
    quotient = abs(a) // abs(b)
    return quotient if (a >= 0) == (b > 0) else -quotient


def _round_to_int16(value: int) -> int:
    """swscale's roundToInt16: a 16.16 number rounded to an int16, saturated."""
    rounded = (value + (1 << 15)) >> 16
    return -0x8000 if rounded < -0x7FFF else min(rounded, 0x7FFF)


def _lut(values: np.ndarray) -> np.ndarray:
    """A (1, 256) int16 table, as cv2.LUT takes it."""
    return np.ascontiguousarray(values, dtype=np.int16).reshape(1, 256)


def swscale_tables(colorimetry: Colorimetry, arithmetic: Arithmetic) -> Tables:
    """swscale's coefficients for `colorimetry` (ff_yuv2rgb_c_init_tables, with the brightness,
    contrast and saturation sws_init_context sets: 0, 1.0, 1.0), as `Tables` for `arithmetic`."""
    crv, cbu, cgu, cgv = SWS_COEFFICIENTS[colorimetry.matrix]
    cgu, cgv = -cgu, -cgv
    cy, oy = 1 << 16, 0
    if colorimetry.full_range:
        crv, cbu, cgu, cgv = (_c_div(c * 224, 255) for c in (crv, cbu, cgu, cgv))
    else:
        cy, oy = _c_div(cy * 255, 219), 16 << 16
    if arithmetic is Arithmetic.X86:
        return _x86_tables(cy, oy, crv, cbu, cgu, cgv)
    return _c_tables(cy, oy, colorimetry.full_range, crv, cbu, cgu, cgv)


def _x86_tables(cy: int, oy: int, crv: int, cbu: int, cgu: int, cgv: int) -> Tables:
    """yuv_2_rgb.asm's terms: (8Y - yOffset) * yCoeff and (8U - 1024) * ubCoeff etc., each the high
    16 bits of the product (pmulhw), the coefficients rounded to 16 bits (roundToInt16)."""
    samples = np.arange(256, dtype=np.int64)
    y_coeff, y_offset = _round_to_int16(cy << 13), _round_to_int16(oy << 3)
    chroma = samples * 8 - 0x400  # U' = 8U - 1024, V' likewise (uOffset, vOffset)

    def mulhi(coefficient: int) -> np.ndarray:
        return (chroma * _round_to_int16(coefficient << 13)) >> 16
    return Tables(_lut(((samples * 8 - y_offset) * y_coeff) >> 16), _lut(mulhi(cbu)), _lut(mulhi(cgu)),
                  _lut(mulhi(cgv)), _lut(mulhi(crv)), None)


def _c_tables(cy: int, oy: int, full_range: bool, crv: int, cbu: int, cgu: int, cgv: int) -> Tables:
    """yuv2rgb.c's tables for 24 bits: a clipped luma table, read at Y plus an offset for U (blue),
    for U and V (green) and for V (red), the chroma coefficients scaled by the luma one."""
    samples = np.arange(256, dtype=np.int64)
    crv, cbu, cgu, cgv = (_c_div(c * (1 << 16) + 0x8000, max(cy, 1)) for c in (crv, cbu, cgu, cgv))
    luma_table = np.clip((-(384 << 16) - 512 * cy - oy + np.arange(2048, dtype=np.int64) * cy + 0x8000) >> 16, 0, 255)
    base = (384 if full_range else 326) + 512  # where Y = 0 reads with no chroma
    # The table is 0 up to `first`, 255 from `first + 255` on (its slope is 255/219 or 1): reading
    # it at the sum clipped to first..first + 255 changes nothing, so the sum is kept 8-bit.
    first = int(np.flatnonzero(luma_table == 0)[-1])
    if luma_table[first + 255] != 255:
        raise ValueError("swscale's luma table rises over more than 256 entries")
    base -= first

    def offset(coefficient: int) -> np.ndarray:  # fill_table: where a chroma sample moves the read
        return ((samples * coefficient) >> 16) - (coefficient >> 9)
    return Tables(_lut(samples), _lut(base + offset(cbu)), _lut(base + offset(cgu)), _lut(offset(cgv)),
                  _lut(base + offset(crv)), np.ascontiguousarray(luma_table[first:first + 256], np.uint8))


def plane(data: Any, offset: int, stride: int, rows: int, columns: int) -> np.ndarray:
    """A (rows, columns) view of one plane, no copy. numpy raises TypeError when the buffer is
    smaller than the layout says (a producer's caps that lie)."""
    return np.ndarray((rows, columns), np.uint8, data, offset, (stride, 1))


class _Buffers:
    """The arrays a strip of a picture `width` wide is computed in: views of one memory mapping of
    their own (`framepool.allocate`), so a converter that lets them go between frames gives the
    memory back to the system at once (a malloc'd array would stay in the thread's heap)."""

    def __init__(self, width: int) -> None:
        chroma_width = (width + 1) // 2
        rows = strip_rows(width)
        chroma_rows = rows // 2
        self.width = width
        shapes = {
            # the planes' rows copied in: cv2 copies a read-only array (a mapped buffer) on every call
            "y": ((rows, width), np.uint8), "u": ((chroma_rows, chroma_width), np.uint8),
            "v": ((chroma_rows, chroma_width), np.uint8),
            "luma": ((rows, width), np.int16),  # the luma term of each pixel
            "terms": ((4, chroma_rows, chroma_width), np.int16),  # blue, green (U), green (V), red
            # each chroma sample's three terms twice: the two pixels of a block row side by side
            "chroma": ((chroma_rows, chroma_width, 6), np.int16),
            "sums": ((rows, width, 3), np.int16),  # luma term, then plus chroma terms
        }
        sizes = {name: _aligned(int(np.prod(shape)) * np.dtype(dtype).itemsize)
                 for name, (shape, dtype) in shapes.items()}
        self.block = allocate((sum(sizes.values()),))
        self.nbytes = self.block.nbytes
        offset = 0
        for name, (shape, dtype) in shapes.items():
            count = int(np.prod(shape))
            view = self.block[offset:offset + count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
            setattr(self, name, view)
            offset += sizes[name]
    y: np.ndarray
    u: np.ndarray
    v: np.ndarray
    luma: np.ndarray
    terms: np.ndarray
    chroma: np.ndarray
    sums: np.ndarray


def _aligned(size: int, alignment: int = 64) -> int:
    return -(-size // alignment) * alignment


class _Strip:
    """`rows` rows of a picture (the last strip may be shorter), as views of `_Buffers`: made
    once, not on every frame. An odd last row is computed with the next one as scratch."""

    def __init__(self, buffers: _Buffers, rows: int) -> None:
        width, even_rows, chroma_rows = buffers.width, rows + rows % 2, (rows + 1) // 2
        self.rows = rows
        self.y, self.u, self.v = buffers.y[:rows], buffers.u[:chroma_rows], buffers.v[:chroma_rows]
        self.blue, self.green, self.green_v, self.red = buffers.terms[:, :chroma_rows]
        self.chroma = buffers.chroma[:chroma_rows]
        self.luma = buffers.luma[:rows]
        self.luma_even = buffers.luma[:even_rows]
        self.sums = buffers.sums[:even_rows]
        self.picture = buffers.sums[:rows]
        # a block's chroma terms serve both of its rows: the even rows' sums, then the odd rows'
        by_row = self.sums.reshape(chroma_rows, 2, width, 3)
        self.row_sums = (by_row[:, 0], by_row[:, 1])
        self.pixels = self.chroma.reshape(chroma_rows, -1, 3)[:, :width]

    def convert(self, tables: Tables, luma: np.ndarray, u: np.ndarray, v: np.ndarray, out: np.ndarray) -> None:
        """`out` (rows, width, 3) from `luma` (rows, width), `u` and `v` (half the rows, rounded up)."""
        np.copyto(self.y, luma)
        np.copyto(self.u, u)
        np.copyto(self.v, v)
        cv2.LUT(self.u, tables.blue_u, dst=self.blue)
        cv2.LUT(self.u, tables.green_u, dst=self.green)
        cv2.LUT(self.v, tables.green_v, dst=self.green_v)
        cv2.add(self.green, self.green_v, dst=self.green)
        cv2.LUT(self.v, tables.red_v, dst=self.red)
        cv2.merge([self.blue, self.green, self.red] * 2, dst=self.chroma)
        cv2.LUT(self.y, tables.luma, dst=self.luma)
        cv2.merge([self.luma_even] * 3, dst=self.sums)
        for row_sums in self.row_sums:
            cv2.add(row_sums, self.pixels, dst=row_sums)
        np.clip(self.picture, 0, 255, out=out, casting="unsafe")
        if tables.final is not None:
            flat = out.reshape(self.rows, -1)
            cv2.LUT(flat, tables.final, dst=flat)


class I420Converter:
    """Converts one source's I420 frames (one source, one thread, as every source). It keeps the
    arrays of a strip between frames (0.9 MB at 1080p), or with `keep_buffers=False` lets them go
    after each frame: for a source that converts only the frames its camera keeps (`pyav`), whose
    cameras then hold them only while converting; making them again costs a mapping, its page
    faults and the strips' views: 1.5 ms a 1080p frame on a loaded 2-core VM, against 16 ms for
    the conversion."""

    def __init__(self, arithmetic: Arithmetic | None = None, keep_buffers: bool = True) -> None:
        self.arithmetic = native_arithmetic() if arithmetic is None else arithmetic
        self.keep_buffers = keep_buffers
        self._buffers: _Buffers | None = None
        self._strips: dict[int, _Strip] = {}  # by rows: a full strip, and a picture's last one
        self._tables: dict[Colorimetry, Tables] = {}

    def to_bgr(self, data: Any, layout: PlaneLayout, colorimetry: Colorimetry = BT601,
               out: np.ndarray | None = None) -> np.ndarray:
        """The picture as (height, width, 3) BGR: into `out` when its shape fits (no allocation),
        else a new array. TypeError: the buffer is smaller than `layout`."""
        w, h = layout.width, layout.height
        chroma_w, chroma_h = (w + 1) // 2, (h + 1) // 2
        luma = plane(data, layout.offsets[0], layout.strides[0], h, w)
        u = plane(data, layout.offsets[1], layout.strides[1], chroma_h, chroma_w)
        v = plane(data, layout.offsets[2], layout.strides[2], chroma_h, chroma_w)
        return self.planes_to_bgr(luma, u, v, colorimetry, out)

    def planes_to_bgr(self, luma: np.ndarray, u: np.ndarray, v: np.ndarray, colorimetry: Colorimetry = BT601,
                      out: np.ndarray | None = None) -> np.ndarray:
        """The picture of a (height, width) `luma` plane and its chroma planes (half the size,
        rounded up; any strides: NV12's interleaved U and V as views) as `to_bgr` gives it."""
        h, w = luma.shape
        fits = out is not None and out.shape == (h, w, 3) and out.dtype == np.uint8 and out.flags.c_contiguous
        target = out if fits and out is not None else np.empty((h, w, 3), np.uint8)
        tables = self._tables.get(colorimetry)
        if tables is None:
            tables = self._tables[colorimetry] = swscale_tables(colorimetry, self.arithmetic)
        step = strip_rows(w)
        try:
            for top in range(0, h, step):
                bottom = min(h, top + step)
                self._strip(w, bottom - top).convert(tables, luma[top:bottom], u[top // 2:(bottom + 1) // 2],
                                                     v[top // 2:(bottom + 1) // 2], target[top:bottom])
        finally:
            if not self.keep_buffers:
                self._buffers, self._strips = None, {}
        return target

    def _strip(self, width: int, rows: int) -> _Strip:
        if self._buffers is None or self._buffers.width != width:
            self._buffers, self._strips = _Buffers(width), {}
        strip = self._strips.get(rows)
        if strip is None:
            strip = self._strips[rows] = _Strip(self._buffers, rows)
        return strip

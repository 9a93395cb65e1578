"""How a picture is laid out -- its chroma subsampling and bit depth -- told without decoding it.

A hardware decoder (the Atlas card's DVPP: VDEC for H.264/H.265, JPEGD for JPEG) takes only some
layouts, and a camera must be turned to another decoder *before* its first frame is sent, not
after the card refused one. So the layout is read from what the host has anyway: FFmpeg's pixel
format name for a video stream (`pix_fmt_layout`, used by `demux.StreamInfo`), the frame header
of a JPEG (`jpeg_info`, on the marker walk of `imagesize`). Which layouts the card takes is
`backends.dvpp_limits`' business, not this module's.

Nothing here imports PyAV or OpenCV: the pixel format names follow FFmpeg's naming (libavutil
pixdesc), and the test checks the table against PyAV's own format descriptors.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from enum import Enum

from .imagesize import jpeg_frame_header


class Chroma(str, Enum):
    """Chroma subsampling (J:a:b), as the codecs' specifications name it."""

    YUV420 = "4:2:0"
    YUV422 = "4:2:2"
    YUV444 = "4:4:4"
    YUV440 = "4:4:0"
    YUV411 = "4:1:1"
    YUV410 = "4:1:0"
    GRAY = "4:0:0"  # luma only (monochrome)


_PLANAR = re.compile(r"^yuva?j?(?P<layout>420|422|444|440|411|410)p(?P<bits>\d+)?(le|be)?$")
_GRAY = re.compile(r"^(gray|ya)(?P<bits>\d+)?(le|be)?$")
#: (semi-)packed formats: FFmpeg's names that carry no J:a:b in the planar spelling
_OTHERS: dict[str, tuple[Chroma, int]] = {
    "nv12": (Chroma.YUV420, 8), "nv21": (Chroma.YUV420, 8), "nv16": (Chroma.YUV422, 8),
    "nv61": (Chroma.YUV422, 8), "nv24": (Chroma.YUV444, 8), "nv42": (Chroma.YUV444, 8),
    "nv20le": (Chroma.YUV422, 10), "nv20be": (Chroma.YUV422, 10),
    "p010le": (Chroma.YUV420, 10), "p010be": (Chroma.YUV420, 10),
    "p012le": (Chroma.YUV420, 12), "p012be": (Chroma.YUV420, 12),
    "p016le": (Chroma.YUV420, 16), "p016be": (Chroma.YUV420, 16),
    "p210le": (Chroma.YUV422, 10), "p210be": (Chroma.YUV422, 10),
    "p212le": (Chroma.YUV422, 12), "p212be": (Chroma.YUV422, 12),
    "p216le": (Chroma.YUV422, 16), "p216be": (Chroma.YUV422, 16),
    "p410le": (Chroma.YUV444, 10), "p410be": (Chroma.YUV444, 10),
    "p412le": (Chroma.YUV444, 12), "p412be": (Chroma.YUV444, 12),
    "p416le": (Chroma.YUV444, 16), "p416be": (Chroma.YUV444, 16),
    "yuyv422": (Chroma.YUV422, 8), "uyvy422": (Chroma.YUV422, 8), "yvyu422": (Chroma.YUV422, 8),
    "y210le": (Chroma.YUV422, 10), "y210be": (Chroma.YUV422, 10),
    "y212le": (Chroma.YUV422, 12), "y212be": (Chroma.YUV422, 12),
    "uyyvyy411": (Chroma.YUV411, 8),
}
_SUBSAMPLING = {"420": Chroma.YUV420, "422": Chroma.YUV422, "444": Chroma.YUV444, "440": Chroma.YUV440,
                "411": Chroma.YUV411, "410": Chroma.YUV410}


def pix_fmt_layout(pix_fmt: str | None) -> tuple[Chroma | None, int | None]:
    """(chroma subsampling, bits per sample) of an FFmpeg pixel format name (`yuv420p`: 4:2:0, 8;
    `yuv420p10le`: 4:2:0, 10; `nv12`: 4:2:0, 8; `gray`: 4:0:0, 8); (None, None) for a format that
    is not YUV or grey (RGB, Bayer, hardware surfaces) or unknown."""
    if not pix_fmt:
        return None, None
    name = pix_fmt.lower()
    if name in _OTHERS:
        return _OTHERS[name]
    planar = _PLANAR.match(name)
    if planar is not None:
        return _SUBSAMPLING[planar["layout"]], int(planar["bits"] or 8)
    gray = _GRAY.match(name)
    if gray is not None:
        return Chroma.GRAY, int(gray["bits"] or 8)
    return None, None


# -- JPEG ------------------------------------------------------------------------------------------

class JpegCoding(str, Enum):
    """The coding process a JPEG's frame header (its SOFn marker) names."""

    BASELINE = "baseline"  # SOF0
    EXTENDED = "extended"  # SOF1: sequential, 8 or 12 bits
    PROGRESSIVE = "progressive"  # SOF2
    LOSSLESS = "lossless"  # SOF3
    HIERARCHICAL = "hierarchical"  # SOF5-7, SOF13-15
    ARITHMETIC = "arithmetic"  # SOF9-11: arithmetic entropy coding


_CODING = {0xC0: JpegCoding.BASELINE, 0xC1: JpegCoding.EXTENDED, 0xC2: JpegCoding.PROGRESSIVE,
           0xC3: JpegCoding.LOSSLESS, 0xC9: JpegCoding.ARITHMETIC, 0xCA: JpegCoding.ARITHMETIC,
           0xCB: JpegCoding.ARITHMETIC}
#: (largest horizontal / the chroma components' horizontal factor, the same vertically) -> J:a:b
_RATIOS = {(2, 2): Chroma.YUV420, (2, 1): Chroma.YUV422, (1, 1): Chroma.YUV444, (1, 2): Chroma.YUV440,
           (4, 1): Chroma.YUV411, (4, 2): Chroma.YUV410}


@dataclass(frozen=True)
class JpegInfo:
    """What a JPEG's frame header says: its size, chroma subsampling (None for a layout that has no
    J:a:b name: Cb and Cr sampled differently, 2 or 4 components), sample precision and coding."""

    width: int
    height: int
    chroma: Chroma | None
    bit_depth: int
    coding: JpegCoding
    components: int


def jpeg_info(data: bytes) -> JpegInfo | None:
    """The frame header of the JPEG in `data`, read without decoding it; None when `data` is not a
    JPEG or its header is missing or cut short."""
    if data[:2] != b"\xff\xd8":
        return None
    try:
        at = jpeg_frame_header(data)
        if at is None:
            return None
        precision, height, width, count = struct.unpack_from(">BHHB", data, at + 4)
        factors = [(data[at + 10 + 3 * i + 1] >> 4, data[at + 10 + 3 * i + 1] & 0x0F) for i in range(count)]
    except (struct.error, IndexError):
        return None
    coding = _CODING.get(data[at + 1], JpegCoding.HIERARCHICAL)
    return JpegInfo(int(width), int(height), _jpeg_chroma(factors), int(precision), coding, int(count))


def _jpeg_chroma(factors: list[tuple[int, int]]) -> Chroma | None:
    """J:a:b of a frame's components' (horizontal, vertical) sampling factors."""
    if len(factors) == 1:
        return Chroma.GRAY
    if len(factors) != 3 or factors[1] != factors[2] or 0 in factors[1]:
        return None
    (h_max, v_max), (h_c, v_c) = factors[0], factors[1]
    if h_max % h_c or v_max % v_c:
        return None
    return _RATIOS.get((h_max // h_c, v_max // v_c))

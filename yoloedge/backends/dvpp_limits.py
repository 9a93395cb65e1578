"""What Ascend's DVPP can take, as plain facts and arithmetic: no `acl`, no OpenCV.

The DVPP engine (`dvpp.py`, `dvpp_vdec.py`, `dvpp_vpc.py`) needs these, and so does anything that
must decide before opening a card whether a camera can be decoded there (a configuration check, the
reader that picks a decoder), so they live here where importing them costs nothing and needs no
CANN install.

Three kinds of fact:

* the C enums of `acl/ops/acl_dvpp.h` that pyACL takes as plain ints (pyACL defines no constants,
  see `acl_runtime`): pixel formats, VDEC stream formats ("entype");
* alignment rules: VDEC and VPC work on YUV420SP (NV12) pictures whose rows are `width_stride`
  bytes apart and whose UV plane starts `height_stride` rows after the Y plane; JPEGD's output
  strides are coarser and depend on the SoC;
* the letterbox as VPC can do it: Ultralytics' geometry (`preprocess.letterbox.compute_geometry`,
  "center" placement) moved onto VPC's grid (paste area's left edge a multiple of 16, every other
  edge and size even), so that the geometry returned is exactly the one the hardware used and boxes
  map back without a one-pixel drift.

Sources: the pyACL wrapper source (`hicann/runtime`, `python/pyACL/media/*.cpp`) for names and
argument orders, the CANN DVPP pages and Ascend samples (acllite) for the alignment rules; figures
that no source confirmed are marked UNCONFIRMED where they are defined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..preprocess.letterbox import Geometry

# acldvppPixelFormat
PIXEL_FORMAT_YUV_400 = 0
PIXEL_FORMAT_YUV_SEMIPLANAR_420 = 1  # NV12: Y plane, then interleaved U,V
PIXEL_FORMAT_YVU_SEMIPLANAR_420 = 2  # NV21

# acldvppStreamFormat (what vdec_set_channel_desc_entype takes)
H265_MAIN_LEVEL = 0
H264_BASELINE_LEVEL = 1
H264_MAIN_LEVEL = 2
H264_HIGH_LEVEL = 3

#: acldvppResizeConfig interpolation values (0 is the default: Huawei's own filter)
INTERPOLATION_DEFAULT = 0
INTERPOLATION_BILINEAR_OPENCV = 1

#: VPC's letterbox grey in YUV: Y=114, U=V=128 is RGB (114, 114, 114) after the BT.601
#: limited-range AIPP matrix (298*(114-16) >> 8 = 114), the pad value Ultralytics uses.
PAD_Y = 114
PAD_UV = 128

#: VPC's resize ratio range (per axis), from the CANN VPC constraints.
VPC_MIN_SCALE = 1 / 32
VPC_MAX_SCALE = 16.0


@dataclass(frozen=True)
class SocLimits:
    """What one chip's DVPP does. Figures marked UNCONFIRMED in `DVPP_LIMITS` are estimates."""

    soc: str
    vdec_channels: int  # VDEC channels one chip can have open at once
    vdec_fps_1080p: int  # 1080p frames per second one chip decodes in total
    vdec_max: tuple[int, int]  # largest (width, height)
    vdec_min: tuple[int, int]  # smallest (width, height)
    jpegd_align: tuple[int, int]  # JPEGD output (width, height) stride alignment
    hevc_10bit: bool = False  # whether VDEC takes H.265 Main 10 streams (decoded to 8-bit NV12)
    confirmed: bool = False  # whether the VDEC figures come from a Huawei source we could read

    def budget_note(self) -> str:
        return "" if self.confirmed else " (UNCONFIRMED figure)"


#: Per SoC name as `acl.get_soc_name()` answers it.
#: * Ascend310P3 (Atlas 300I Pro / 300V Pro, one chip per card): UNCONFIRMED: Huawei's
#:   datasheets give 1080p30 decode channel counts between 80 and 128 per chip depending on the
#:   card and the document; 2400 frames/s (80 x 1080p30) is the conservative figure. 256 channel
#:   ids by the newer VDEC pages (0..255), fewer in an old header. JPEGD output strides 64 x 16
#:   (acllite's choice for Ascend310P3). Confirmed by the CANN VDEC page ("Atlas inference
#:   products"): input 128x128 to 4096x4096, H.264 BP/MP/HP and H.265 8-/10-bit 4:2:0 Annex-B.
#:   UNCONFIRMED: that a Main 10 stream comes out as 8-bit NV12 without setting a bit depth.
#: * Ascend310 (Atlas 300 3000/3010, Atlas 200 DK): 16 x 1080p30 per chip (the Ascend 310
#:   datasheet; UNCONFIRMED here, not read in a source this session), JPEGD strides 128 x 16.
DVPP_LIMITS: dict[str, SocLimits] = {
    "Ascend310P3": SocLimits("Ascend310P3", vdec_channels=256, vdec_fps_1080p=2400,
                             vdec_max=(4096, 4096), vdec_min=(128, 128), jpegd_align=(64, 16), hevc_10bit=True),
    "Ascend310": SocLimits("Ascend310", vdec_channels=16, vdec_fps_1080p=480,
                           vdec_max=(4096, 4096), vdec_min=(128, 128), jpegd_align=(128, 16)),
}
#: What an unknown SoC is assumed to do (the conservative row).
DEFAULT_LIMITS = DVPP_LIMITS["Ascend310"]


def limits_for(soc: str | None) -> SocLimits:
    """The row for `soc`; "Ascend310P1".."Ascend310P3" share one, unknown chips get the 310's."""
    if not soc:
        return DEFAULT_LIMITS
    if soc in DVPP_LIMITS:
        return DVPP_LIMITS[soc]
    if soc.startswith("Ascend310P"):
        return DVPP_LIMITS["Ascend310P3"]
    return DEFAULT_LIMITS


# -- alignment ------------------------------------------------------------------------------------
def align_up(value: int, to: int) -> int:
    return (int(value) + to - 1) // to * to


def nv12_size(width_stride: int, height_stride: int) -> int:
    """Bytes of an NV12 picture: a full Y plane and a half-height interleaved UV plane."""
    return width_stride * height_stride * 3 // 2


def vdec_strides(width: int, height: int) -> tuple[int, int]:
    """VDEC (and VPC input) NV12 strides: width to 16, height to 2 (acllite's VDEC/VPC input
    rule; the 310P VDEC page says the same for YUV420SP output)."""
    return align_up(width, 16), align_up(height, 2)


def vdec_buffer_size(width: int, height: int) -> int:
    """Bytes to allocate for one VDEC output picture: NV12 at strides of 64 x 16, a margin over
    the documented 16 x 2 (UNCONFIRMED for the 310P's VDEC: its page was not read this session;
    the engine reads the strides VDEC used back from each picture's descriptor)."""
    return nv12_size(align_up(width, 64), align_up(height, 16))


def jpegd_strides(width: int, height: int, soc: str | None) -> tuple[int, int]:
    """JPEGD output strides for `soc` (64 x 16 on Ascend310P, 128 x 16 on Ascend310)."""
    wa, ha = limits_for(soc).jpegd_align
    return align_up(width, wa), align_up(height, ha)


def canvas_size(width: int, height: int) -> int:
    """Bytes of a VPC output canvas of `width` x `height` (which `check_canvas` requires aligned)."""
    check_canvas(width, height)
    return nv12_size(width, height)


def check_canvas(width: int, height: int) -> None:
    """A model-input canvas VPC writes into must need no padding of its own: its rows are exactly
    `width` bytes (a multiple of 16) and its height is even, so the model (AIPP YUV420SP input of
    width x height) reads the canvas as it lies."""
    if width <= 0 or height <= 0 or width % 16 or height % 2:
        raise ValueError(f"a DVPP canvas must be a multiple of 16 wide and of 2 high, not {width}x{height}")


# -- the letterbox on VPC's grid -----------------------------------------------------------------------
@dataclass(frozen=True)
class VpcPaste:
    """One letterbox as VPC does it: the crop of the source (inclusive, right/bottom odd) and the
    paste rectangle in the canvas; `src_w`/`src_h` are the cropped source size (odd sizes lose
    their last column/row: VPC crops to even sizes)."""

    src_w: int
    src_h: int
    new_w: int
    new_h: int
    left: int
    top: int

    @property
    def crop(self) -> tuple[int, int, int, int]:
        """(left, right, top, bottom) as `dvpp_set_roi_config` takes them (right/bottom inclusive)."""
        return 0, self.src_w - 1, 0, self.src_h - 1

    @property
    def paste(self) -> tuple[int, int, int, int]:
        return self.left, self.left + self.new_w - 1, self.top, self.top + self.new_h - 1

    def geometry(self) -> Geometry:
        from ..preprocess.letterbox import Geometry
        return Geometry(self.src_w, self.src_h, self.new_w, self.new_h, self.left, self.top)


def _even(value: float) -> int:
    """The nearest even integer (halves go down), at least 2."""
    return max(2, int(round(value / 2)) * 2)


def vpc_letterbox(src_w: int, src_h: int, dst_w: int, dst_h: int) -> VpcPaste:
    """Ultralytics' centred letterbox of a `src_w` x `src_h` picture into `dst_w` x `dst_h`,
    moved onto VPC's grid.

    Ultralytics: r = min(dst_w / w, dst_h / h), new size = round(w*r) x round(h*r), offsets
    round(d/2 - 0.1). VPC: the source crop is even-sized (an odd source loses its last column/row),
    the pasted size is even (nearest even, never beyond the canvas), the top offset even and the left
    offset a multiple of 16 (nearest, ties downwards), moved inwards where the picture would cross
    the canvas edge. The two axes may then scale slightly differently; the returned rectangle says
    by how much, so boxes go back exactly.
    """
    check_canvas(dst_w, dst_h)
    w, h = int(src_w) & ~1, int(src_h) & ~1
    if w < 2 or h < 2:
        raise ValueError(f"a {src_w}x{src_h} picture is too small for VPC")
    r = min(dst_w / w, dst_h / h)
    new_w = min(_even(round(w * r)), dst_w)
    new_h = min(_even(round(h * r)), dst_h)
    left = int(round((dst_w - round(w * r)) / 2 - 0.1))
    top = int(round((dst_h - round(h * r)) / 2 - 0.1))
    left = min((max(left, 0) + 7) // 16 * 16, (dst_w - new_w) // 16 * 16)
    top = min(int(round(max(top, 0) / 2)) * 2, dst_h - new_h)
    for axis, new, old in (("width", new_w, w), ("height", new_h, h)):
        scale = new / old
        if not VPC_MIN_SCALE <= scale <= VPC_MAX_SCALE:
            raise ValueError(f"VPC scales by 1/32 to 16 per axis; a {src_w}x{src_h} picture into "
                             f"{dst_w}x{dst_h} scales its {axis} by {scale:.4f}")
    return VpcPaste(w, h, new_w, new_h, left, top)


# -- what VDEC can decode ------------------------------------------------------------------------------
#: profile names as FFmpeg/PyAV spell them -> entype
_H264_PROFILES = {"baseline": H264_BASELINE_LEVEL, "constrained baseline": H264_BASELINE_LEVEL,
                  "main": H264_MAIN_LEVEL, "high": H264_HIGH_LEVEL}
_H265_PROFILES = {"main": H265_MAIN_LEVEL}
_H265_10BIT_PROFILES = {"main 10"}
_PIX_FMTS_420_10 = {"yuv420p10le", "yuv420p10be", "p010le"}
#: 8-bit 4:2:0 pixel formats as FFmpeg names them (the only ones VDEC decodes to NV12 here)
_PIX_FMTS_420 = {"yuv420p", "yuvj420p", "nv12", "nv21"}
_CODECS = {"h264": "h264", "avc": "h264", "avc1": "h264", "h265": "h265", "hevc": "h265", "hvc1": "h265",
           "hev1": "h265"}


def vdec_codec(codec: str) -> str | None:
    """"h264" / "h265" for the names FFmpeg, PyAV and RTSP SDP use; None for anything else."""
    return _CODECS.get((codec or "").strip().lower())


def vdec_entype(codec: str, profile: str | None = None) -> int:
    """The `vdec_set_channel_desc_entype` value. An unknown H.264 profile gets High's entype
    (which decodes Baseline and Main streams too: High is a superset)."""
    kind = vdec_codec(codec)
    if kind == "h265":
        return H265_MAIN_LEVEL  # Main and Main 10 alike
    if kind == "h264":
        return _H264_PROFILES.get((profile or "").strip().lower(), H264_HIGH_LEVEL)
    raise ValueError(f"VDEC decodes H.264 and H.265 only, not {codec!r}")


def dvpp_unsupported(codec: str, profile: str | None, pix_fmt: str | None, width: int | None,
                     height: int | None, soc: str | None = None) -> str | None:
    """Why VDEC cannot decode this stream (to NV12 for the letterbox), or None if it can.

    Unknown facts (None) are not held against the stream: the decoder finds out at the first
    frame. Refused: codecs other than H.264/H.265; 4:2:2/4:4:4 streams and 10-bit H.264 (High 10,
    High 4:2:2, High 4:4:4, RExt); H.265 Main 10 where the chip's VDEC does not take it (it does
    on the 310P); sizes outside the chip's VDEC range (128x128 to 4096x4096).
    """
    kind = vdec_codec(codec)
    if kind is None:
        return f"DVPP's VDEC decodes H.264 and H.265 only, not {codec or 'an unknown codec'}"
    name = "H.264" if kind == "h264" else "H.265"
    lim = limits_for(soc)
    ten_bit = kind == "h265" and lim.hevc_10bit
    if profile:
        known = set(_H264_PROFILES) if kind == "h264" else set(_H265_PROFILES)
        if ten_bit:
            known |= _H265_10BIT_PROFILES
        if profile.strip().lower() not in known:
            return f"VDEC of {lim.soc} does not decode {name} {profile} streams"
    if pix_fmt:
        fmts = _PIX_FMTS_420 | (_PIX_FMTS_420_10 if ten_bit else set())
        if pix_fmt.strip().lower() not in fmts:
            return f"VDEC of {lim.soc} does not decode {name} {pix_fmt} pictures"
    if width and height:
        (max_w, max_h), (min_w, min_h) = lim.vdec_max, lim.vdec_min
        if width > max_w or height > max_h:
            return f"{width}x{height} is larger than VDEC's {max_w}x{max_h}"
        if width < min_w or height < min_h:
            return f"{width}x{height} is smaller than VDEC's {min_w}x{min_h}"
    return None

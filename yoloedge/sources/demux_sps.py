"""The chroma format and bit depth an H.264 / H.265 stream is coded in, read from its sequence
parameter set.

FFmpeg learns a stream's pixel format by decoding its first frames while it opens it
(`avformat_find_stream_info`); `demux` opens without decoding (`skip_frame`), so FFmpeg leaves the
pixel format unknown, and it is read here from the first fields of the SPS instead: H.264
(ITU-T H.264 7.3.2.1.1) and H.265 (ITU-T H.265 7.3.2.2, after `profile_tier_level`, 7.3.3).
Only the fields up to the bit depths are parsed. The result is compared, in the tests, with the
pixel format FFmpeg's probe decode reports on the same clips.
"""

from __future__ import annotations

from .demux_layout import Chroma
from .demux_nal import Codec

#: H.264 profile_idc values whose SPS carries chroma_format_idc and the bit depths (7.3.2.1.1);
#: the others are 4:2:0, 8 bits
_H264_EXTENDED_PROFILES = frozenset({100, 110, 122, 244, 44, 83, 86, 118, 128, 138, 139, 134, 135})
_CHROMA_IDC = {0: Chroma.GRAY, 1: Chroma.YUV420, 2: Chroma.YUV422, 3: Chroma.YUV444}
_PIX_FMT = {Chroma.GRAY: "gray", Chroma.YUV420: "yuv420p", Chroma.YUV422: "yuv422p", Chroma.YUV444: "yuv444p"}


class _Bits:
    """An RBSP read bit by bit (emulation prevention bytes removed). Raises IndexError at its end."""

    def __init__(self, nal_payload: bytes):
        self._data = nal_payload.replace(b"\x00\x00\x03", b"\x00\x00")
        self._at = 0

    def u(self, count: int) -> int:
        value = 0
        for _ in range(count):
            byte = self._data[self._at >> 3]
            value = (value << 1) | ((byte >> (7 - (self._at & 7))) & 1)
            self._at += 1
        return value

    def ue(self) -> int:
        zeros = 0
        while self.u(1) == 0:
            zeros += 1
            if zeros > 31:
                raise ValueError("an Exp-Golomb code longer than 32 bits")
        return (1 << zeros) - 1 + self.u(zeros)


def sps_layout(codec: Codec, sps: bytes) -> tuple[Chroma, int]:
    """(chroma format, luma bit depth) of a sequence parameter set NAL unit (with its header).
    Raises ValueError when it is cut short or malformed."""
    try:
        return _h264(sps) if codec is Codec.H264 else _h265(sps)
    except IndexError:
        raise ValueError("the sequence parameter set is cut short") from None


def layout_pix_fmt(chroma: Chroma, bit_depth: int) -> str | None:
    """FFmpeg's name for planar samples of this layout (`yuv420p`, `yuv422p10le`, `gray12le`)."""
    base = _PIX_FMT.get(chroma)
    if base is None:
        return None
    return base if bit_depth == 8 else f"{base}{bit_depth}le"


def _h264(sps: bytes) -> tuple[Chroma, int]:
    bits = _Bits(sps[1:])
    profile_idc = bits.u(8)
    bits.u(16)  # constraint flags, level_idc
    bits.ue()  # seq_parameter_set_id
    if profile_idc not in _H264_EXTENDED_PROFILES:
        return Chroma.YUV420, 8
    chroma_idc = bits.ue()
    if chroma_idc == 3:
        bits.u(1)  # separate_colour_plane_flag
    return _layout(chroma_idc, bits.ue())


def _h265(sps: bytes) -> tuple[Chroma, int]:
    bits = _Bits(sps[2:])
    bits.u(4)  # sps_video_parameter_set_id
    sub_layers = bits.u(3)  # sps_max_sub_layers_minus1
    bits.u(1)  # sps_temporal_id_nesting_flag
    bits.u(96)  # general profile (88 bits) and level_idc
    present = [(bits.u(1), bits.u(1)) for _ in range(sub_layers)]  # profile, level present
    if sub_layers > 0:
        bits.u(2 * (8 - sub_layers))  # reserved_zero_2bits
    for profile, level in present:
        bits.u(88 * profile + 8 * level)
    bits.ue()  # sps_seq_parameter_set_id
    chroma_idc = bits.ue()
    if chroma_idc == 3:
        bits.u(1)  # separate_colour_plane_flag
    bits.ue(), bits.ue()  # pic_width/height_in_luma_samples
    if bits.u(1):  # conformance_window_flag
        for _ in range(4):
            bits.ue()
    return _layout(chroma_idc, bits.ue())


def _layout(chroma_idc: int, depth_minus8: int) -> tuple[Chroma, int]:
    if chroma_idc not in _CHROMA_IDC or depth_minus8 > 8:
        raise ValueError(f"chroma_format_idc {chroma_idc}, bit depth {depth_minus8 + 8}: not a valid SPS")
    return _CHROMA_IDC[chroma_idc], depth_minus8 + 8

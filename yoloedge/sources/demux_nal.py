"""H.264 and H.265 access units as a hardware decoder takes them: Annex-B, parameter sets in front.

A decoder that joins a stream at a keyframe (the Atlas card's VDEC, fed one access unit at a time)
needs the sequence and picture parameter sets (and for H.265 the video parameter set) before that
keyframe's first slice. An MP4 or MKV file keeps them once, in the stream's extradata (`avcC` /
`hvcC`, ISO/IEC 14496-15), and carries NAL units behind 4-byte lengths; FFmpeg's
`h264_mp4toannexb` / `hevc_mp4toannexb` filters turn those into start codes and insert the
extradata before IDR / IRAP pictures, but not before every keyframe (an I picture with a recovery
point SEI, an open-GOP one, a stream whose sets changed in-band). RTSP cameras send Annex-B with
the sets in the SDP and, mostly, in-band. `ParameterSets` keeps the latest set of each kind from
whichever source and puts the missing ones in front of every keyframe.

Pure bytes, no PyAV: the test feeds the result to FFmpeg's decoder as the oracle.
"""

from __future__ import annotations

import re
import struct
from enum import Enum


class Codec(str, Enum):
    """The codecs whose access units `demux` prepares (the names the card's VDEC knows them by)."""

    H264 = "h264"
    H265 = "h265"


#: NAL unit types: parameter sets in the order they go in front of a keyframe, access unit
#: delimiters, and the types of a keyframe's slices (H.264 IDR; H.265 IRAP: BLA, IDR, CRA)
PARAMETER_TYPES = {Codec.H264: (7, 8), Codec.H265: (32, 33, 34)}
SPS_TYPE = {Codec.H264: 7, Codec.H265: 33}
DELIMITER_TYPE = {Codec.H264: 9, Codec.H265: 35}
KEY_SLICE_TYPES = {Codec.H264: frozenset({5}), Codec.H265: frozenset(range(16, 22))}
START_CODE = b"\x00\x00\x00\x01"
_START = re.compile(b"\x00\x00\x01")


def nal_type(codec: Codec, nal: bytes) -> int:
    """The type of a NAL unit (its first header byte, or two for H.265)."""
    return nal[0] & 0x1F if codec is Codec.H264 else (nal[0] >> 1) & 0x3F


def starts_annexb(data: bytes) -> bool:
    """Whether `data` starts with an Annex-B start code (00 00 01 or 00 00 00 01)."""
    return data[:3] == b"\x00\x00\x01" or data[:4] == START_CODE


def split_annexb(data: bytes) -> list[bytes]:
    """The NAL units of an Annex-B byte stream, without their start codes (the zero bytes that
    pad before a start code are dropped with it, as a decoder does)."""
    starts = [m.end() for m in _START.finditer(data)]
    nals = []
    for i, begin in enumerate(starts):
        end = starts[i + 1] - 3 if i + 1 < len(starts) else len(data)
        nal = data[begin:end].rstrip(b"\x00") if i + 1 < len(starts) else data[begin:end]
        if nal:
            nals.append(nal)
    return nals


def join_annexb(nals: list[bytes]) -> bytes:
    return b"".join(START_CODE + nal for nal in nals)


def length_prefixed(extradata: bytes | None) -> bool:
    """Whether a stream's extradata is an `avcC` / `hvcC` record (its NAL units then come behind
    lengths: MP4, MKV, FLV), rather than Annex-B or absent. As FFmpeg's filters decide it: the
    record starts with its version, 1; Annex-B starts with a start code."""
    return bool(extradata) and len(extradata or b"") >= 7 and not starts_annexb(extradata or b"")


def extradata_parameter_sets(codec: Codec, extradata: bytes | None) -> list[bytes]:
    """The parameter sets in a stream's extradata: an `avcC` / `hvcC` record, or Annex-B.
    Raises ValueError on a record cut short."""
    if not extradata:
        return []
    if starts_annexb(extradata):
        return [nal for nal in split_annexb(extradata) if nal_type(codec, nal) in PARAMETER_TYPES[codec]]
    try:
        return _avcc(extradata) if codec is Codec.H264 else _hvcc(extradata)
    except (struct.error, IndexError):
        raise ValueError("the stream's decoder configuration record is cut short") from None


def _avcc(data: bytes) -> list[bytes]:
    """AVCDecoderConfigurationRecord: 5 header bytes, the SPS count (low 5 bits) and SPSs, the
    PPS count and PPSs, each behind a 16-bit length."""
    nals, at = [], 5
    for mask in (0x1F, 0xFF):
        count, at = data[at] & mask, at + 1
        for _ in range(count):
            (size,), at = struct.unpack_from(">H", data, at), at + 2
            nals.append(_unit(data, at, size))
            at += size
    return nals


def _hvcc(data: bytes) -> list[bytes]:
    """HEVCDecoderConfigurationRecord: 22 header bytes, then arrays of NAL units of one type,
    each a type byte, a 16-bit count and the units behind 16-bit lengths."""
    nals, at = [], 23
    for _ in range(data[22]):
        (count,), at = struct.unpack_from(">H", data, at + 1), at + 3
        for _ in range(count):
            (size,), at = struct.unpack_from(">H", data, at), at + 2
            nals.append(_unit(data, at, size))
            at += size
    return nals


def _unit(data: bytes, at: int, size: int) -> bytes:
    if at + size > len(data):
        raise IndexError("a parameter set runs past the record's end")
    return data[at:at + size]


class ParameterSets:
    """The latest parameter set of each kind a stream carried (extradata, then in-band), and
    putting the missing ones in front of each keyframe (`prepare`)."""

    def __init__(self, codec: Codec, initial: list[bytes]):
        self.codec = codec
        self._types = PARAMETER_TYPES[codec]
        self._latest: dict[int, bytes] = {}
        self._note(initial)

    def _note(self, nals: list[bytes]) -> None:
        for nal in nals:
            kind = nal_type(self.codec, nal)
            if kind in self._types:
                self._latest[kind] = nal

    def is_keyframe(self, nals: list[bytes]) -> bool:
        """Whether an access unit holds a keyframe's slice (IDR, or for H.265 any IRAP picture)."""
        keys = KEY_SLICE_TYPES[self.codec]
        return any(nal_type(self.codec, nal) in keys for nal in nals)

    def prepare(self, data: bytes, keyframe: bool) -> bytes:
        """The Annex-B access unit `data` with the parameter sets it lacks in front (after an
        access unit delimiter) when it is a keyframe; notes those it carries. Non-keyframes and
        keyframes that carry every kind pass as they are."""
        nals = split_annexb(data)
        self._note(nals)
        if not keyframe:
            return data
        present = {nal_type(self.codec, nal) for nal in nals}
        missing = [self._latest[kind] for kind in self._types if kind not in present and kind in self._latest]
        if not missing:
            return data
        lead = 1 if nals and nal_type(self.codec, nals[0]) == DELIMITER_TYPE[self.codec] else 0
        return join_annexb(nals[:lead] + missing + nals[lead:])

    def sps(self) -> bytes | None:
        """The latest sequence parameter set."""
        return self._latest.get(SPS_TYPE[self.codec])

    def complete(self) -> bool:
        """Whether a set of every kind is known (a keyframe can be made decodable on its own)."""
        return all(kind in self._latest for kind in self._types)

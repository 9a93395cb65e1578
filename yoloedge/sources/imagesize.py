"""Reading image files that nobody vetted, without letting one of them take the process down.

A PNG of a few hundred bytes can declare 60000 x 60000 pixels: its zlib body inflates to
anything. OpenCV decodes up to 2^30 pixels (3 GiB as BGR) before it refuses, so one such file in
a camera's folder, or given to `yoloedge detect`, can get the daemon OOM-killed on a small edge
box, and every camera with it. So the size an image claims is read from its header, from bytes
read here under a size bound, and an image over `MAX_IMAGE_PIXELS` is refused before OpenCV
allocates anything. Headers are parsed for JPEG (SOFn), PNG (IHDR), BMP, GIF, WebP (VP8, VP8L,
VP8X), TIFF, PNM/PAM/PFM, JPEG 2000, AVIF, Sun raster and Radiance HDR: every format whose decoder an
OpenCV build ships by default. A file in another format is decoded under the file-size bound, and
under OpenCV's own pixel cap, which every `yoloedge` command lowers to the same bound
(`cli.main.cap_opencv_decoders`) before cv2 is loaded.

The file is opened without following it blindly: a FIFO, a device, a directory or a symlink loop
named `x.jpg` is refused at open/fstat and never blocks a read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import cv2
import numpy as np

from .. import MAX_IMAGE_PIXELS, files  # 8192 x 8192: a 64 MP phone photo fits
from ..errors import ImageError

#: the largest image file read into memory
MAX_IMAGE_BYTES = 256 * 1024 * 1024


class ImageTooLarge(ImageError):
    """The image is over the pixel or file-size bound; it was not decoded."""


@dataclass(frozen=True)
class ImageLimits:
    """The bounds `read_image` enforces; the defaults suit an edge box, tests lower them."""

    max_pixels: int = MAX_IMAGE_PIXELS
    max_bytes: int = MAX_IMAGE_BYTES


DEFAULT_LIMITS = ImageLimits()


def over_pixel_bound(width: int, height: int, limits: ImageLimits = DEFAULT_LIMITS) -> str | None:
    """Why a `width` x `height` image is refused, or None when it is within the bound."""
    if width * height <= limits.max_pixels:
        return None
    return (f"{width}x{height} pixels, over the bound of {limits.max_pixels:,} pixels "
            f"({limits.max_pixels * 3 / 2**20:.0f} MiB as BGR)")


def read_image(path: str, limits: ImageLimits = DEFAULT_LIMITS) -> np.ndarray:
    """The BGR image in the file at `path`. Raises ImageTooLarge for a file or an image over
    `limits`, ImageError for anything else unreadable; messages start with the path."""
    return decode_image(read_bounded(path, limits.max_bytes), path, limits)


def decode_image(data: bytes, label: str, limits: ImageLimits = DEFAULT_LIMITS,
                 decode: Callable[[bytes], np.ndarray] | None = None) -> np.ndarray:
    """The BGR image encoded in `data`, decoded by `decode` (default: OpenCV; a GPU JPEG decoder
    for JPEGs, see `jpeg`) only once its header has passed the pixel bound, whichever decoder it
    is. Errors as `read_image`'s, starting with `label` (a path or a camera)."""
    size = image_size(data)
    if size is not None:
        why = over_pixel_bound(*size, limits)
        if why is not None:
            raise ImageTooLarge(f"{label}: {why}")
    try:
        image = (decode or cv2_decode)(data)
    except ImageError as exc:
        raise ImageError(f"{label}: {exc}") from None
    why = over_pixel_bound(int(image.shape[1]), int(image.shape[0]), limits)
    if why is not None:  # a format whose header we do not read
        raise ImageTooLarge(f"{label}: {why}")
    return image


def cv2_decode(data: bytes) -> np.ndarray:
    """OpenCV's BGR decode of `data`; ImageError (without a label) when it cannot."""
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as exc:  # OpenCV's own pixel cap, a failed allocation, a decoder's assertion
        raise ImageError(f"the decoder refused it: {_first_line(exc)}") from None
    if image is None:
        raise ImageError("cannot decode image (corrupt, truncated or not an image)")
    return image


def read_bounded(path: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` of them (`files.read_bounded`:
    a FIFO, a device or a directory is refused, never read), as ImageError/ImageTooLarge."""
    try:
        data = files.read_bounded(path, max_bytes)
    except files.FileProblem as exc:
        raise (ImageTooLarge if exc.too_large else ImageError)(str(exc)) from None
    if not data:
        raise ImageError(f"{path}: empty file")
    return data


def _first_line(exc: BaseException) -> str:
    """OpenCV's message without its source-file prefix: `(-215:Assertion failed) pixels <= ...`."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text.split(" error: ", 1)[-1]


# -- headers ---------------------------------------------------------------------------------------

def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) as the header of the image in `data` declares it; None when the format is
    not one parsed here or the header is cut short (OpenCV then decides)."""
    for magic, parse in _PARSERS:
        if data.startswith(magic) or (magic == _FTYP and data[4:8] == _FTYP):
            try:
                return parse(data)
            except (struct.error, ValueError, IndexError):
                return None
    return None


def _u16be(data: bytes, at: int) -> int:
    return int(struct.unpack_from(">H", data, at)[0])


def _u32be(data: bytes, at: int) -> int:
    return int(struct.unpack_from(">I", data, at)[0])


def _png(data: bytes) -> tuple[int, int] | None:
    """IHDR is the first chunk: width and height at bytes 16-23."""
    if data[12:16] != b"IHDR":
        return None
    return _u32be(data, 16), _u32be(data, 20)


#: SOF0-SOF15 less DHT (C4), JPG (C8) and DAC (CC)
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
#: markers without a length: TEM, RST0-7, SOI, EOI
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})


def _jpeg(data: bytes) -> tuple[int, int] | None:
    at = jpeg_frame_header(data)
    return None if at is None else (_u16be(data, at + 7), _u16be(data, at + 5))  # length, precision, height, width


def jpeg_frame_header(data: bytes) -> int | None:
    """Where the first frame header (SOFn marker) of the JPEG in `data` starts: walks the marker
    segments (EXIF thumbnails sit inside APP1, skipped whole); None when the scan starts first or
    the data ends. Raises struct.error or IndexError on a segment cut short."""
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:  # garbage between segments: libjpeg skips to the next 0xFF, so do we
            at = data.find(b"\xff", at)
            if at < 0:
                return None
            continue
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _JPEG_STANDALONE:
            at += 2
            continue
        if marker == 0xDA:  # start of scan before any frame header
            return None
        if marker in _JPEG_SOF:
            return at
        at += 2 + _u16be(data, at + 2)
    return None


def _bmp(data: bytes) -> tuple[int, int] | None:
    header = struct.unpack_from("<I", data, 14)[0]
    if header == 12:  # OS/2 BITMAPCOREHEADER: 16-bit sizes
        width, height = struct.unpack_from("<HH", data, 18)
    else:
        width, height = struct.unpack_from("<ii", data, 18)
    return abs(int(width)), abs(int(height))  # negative height: stored top-down


def _gif(data: bytes) -> tuple[int, int] | None:
    width, height = struct.unpack_from("<HH", data, 6)
    return int(width), int(height)


def _webp(data: bytes) -> tuple[int, int] | None:
    if data[8:12] != b"WEBP":
        return None
    chunk = data[12:16]
    if chunk == b"VP8 ":  # lossy: frame tag (3), start code 9D 01 2A, then 14-bit sizes
        if data[23:26] != b"\x9d\x01\x2a":
            return None
        width, height = struct.unpack_from("<HH", data, 26)
        return int(width) & 0x3FFF, int(height) & 0x3FFF
    if chunk == b"VP8L":  # lossless: signature 0x2F, then 14 bits width-1, 14 bits height-1
        if data[20] != 0x2F:
            return None
        bits = int(struct.unpack_from("<I", data, 21)[0])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":  # extended: flags (4), then 24-bit canvas width-1 and height-1
        if len(data) < 30:
            return None
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


def _tiff(data: bytes) -> tuple[int, int] | None:
    """ImageWidth (256) and ImageLength (257) in the first IFD, the page OpenCV reads."""
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(order + "I", data, 4)
    (count,) = struct.unpack_from(order + "H", data, ifd)
    sizes: dict[int, int] = {}
    for entry in range(ifd + 2, ifd + 2 + 12 * count, 12):
        tag, kind = struct.unpack_from(order + "HH", data, entry)
        if tag in (256, 257):
            fmt = order + ("H" if kind == 3 else "I")
            sizes[tag] = int(struct.unpack_from(fmt, data, entry + 8)[0])
    if 256 in sizes and 257 in sizes:
        return sizes[256], sizes[257]
    return None


def _pnm_tokens(data: bytes, count: int) -> list[bytes]:
    """The first `count` tokens after the magic of a PNM/PFM header ('#' comments skipped)."""
    tokens: list[bytes] = []
    for line in data[2:4096].splitlines():
        tokens += line.split(b"#", 1)[0].split()
        if len(tokens) >= count:
            break
    return tokens[:count]


def _pnm(data: bytes) -> tuple[int, int] | None:
    """P1-P6 and PFM: width and height are the first two numbers after the magic."""
    width, height = _pnm_tokens(data, 2)
    return int(width), int(height)


def _pam(data: bytes) -> tuple[int, int] | None:
    fields = {}
    for line in data[3:4096].splitlines():
        key, _, value = line.partition(b" ")
        if key == b"ENDHDR":
            break
        fields[key] = value.strip()
    return int(fields[b"WIDTH"]), int(fields[b"HEIGHT"])


def _sunras(data: bytes) -> tuple[int, int] | None:
    return _u32be(data, 4), _u32be(data, 8)


def _hdr(data: bytes) -> tuple[int, int] | None:
    """Radiance: header lines, an empty line, then `-Y height +X width` (or another orientation)."""
    end = data.find(b"\n\n", 0, 65536)
    if end < 0:
        return None
    line = data[end + 2:end + 2 + 64].split(b"\n", 1)[0].split()
    axes = {line[0][1:]: int(line[1]), line[2][1:]: int(line[3])}
    return axes[b"X"], axes[b"Y"]


def _jp2(data: bytes) -> tuple[int, int] | None:
    """JP2 boxes: the image header box ('ihdr': height, width) inside the header box ('jp2h')."""
    for kind, start, end in _boxes(data, 0, len(data)):
        if kind == b"jp2h":
            for inner, body, _ in _boxes(data, start, end):
                if inner == b"ihdr":
                    return _u32be(data, body + 4), _u32be(data, body)
            return None
    return None


def _boxes(data: bytes, start: int, end: int):
    at = start
    while at + 8 <= end:
        length, kind = _u32be(data, at), data[at + 4:at + 8]
        body = at + 8
        if length == 1:  # 64-bit length follows
            length = int(struct.unpack_from(">Q", data, at + 8)[0])
            body = at + 16
        elif length == 0:  # to the end
            length = end - at
        if length < body - at:
            return
        yield kind, body, min(end, at + length)
        at += length


def _j2k(data: bytes) -> tuple[int, int] | None:
    """A raw JPEG 2000 codestream: SIZ follows SOC; image size minus its offset."""
    xsiz, ysiz, xoff, yoff = struct.unpack_from(">IIII", data, 8)
    return int(xsiz - xoff), int(ysiz - yoff)


_FTYP = b"ftyp"


def _isobmff(data: bytes) -> tuple[int, int] | None:
    """AVIF/HEIF: the largest image spatial extent ('ispe') under meta > iprp > ipco; the file
    may hold a thumbnail and an alpha plane too."""
    sizes = [(_u32be(data, body + 4), _u32be(data, body + 8))
             for body in _descend(data, (b"meta", b"iprp", b"ipco", b"ispe"))]
    return max(sizes, key=lambda wh: wh[0] * wh[1]) if sizes else None


def _descend(data: bytes, path: tuple[bytes, ...]) -> list[int]:
    """Where the bodies of the boxes at `path` start ('meta' is a full box: 4 bytes before its children)."""
    level = [(0, len(data))]
    for name in path:
        found = []
        for start, end in level:
            for kind, body, stop in _boxes(data, start, end):
                if kind == name:
                    found.append((body + 4 if name == b"meta" else body, stop))
        level = found
    return [body for body, _ in level]


_PARSERS = (
    (b"\x89PNG\r\n\x1a\n", _png),
    (b"\xff\xd8", _jpeg),
    (b"BM", _bmp),
    (b"GIF87a", _gif),
    (b"GIF89a", _gif),
    (b"RIFF", _webp),
    (b"II*\x00", _tiff),
    (b"MM\x00*", _tiff),
    *((magic, _pnm) for magic in (b"P1", b"P2", b"P3", b"P4", b"P5", b"P6", b"PF", b"Pf")),
    (b"P7\n", _pam),
    (b"\x59\xa6\x6a\x95", _sunras),
    (b"#?RADIANCE", _hdr),
    (b"#?RGBE", _hdr),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", _jp2),
    (b"\xff\x4f\xff\x51", _j2k),
    (_FTYP, _isobmff),
)

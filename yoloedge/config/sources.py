"""What a camera's source keys may say, as text: decoders, `pipeline:` strings, synthetic URLs, JPEG decoders.

The config reader validates `decoder:`, `pipeline:`, `jpeg_decoder:` and `synthetic://` URLs with
what is here, and so does `sources/`, which reads the cameras: one vocabulary for both. Nothing
here imports OpenCV, PyGObject, PyAV or a GPU binding, nor any `yoloedge.sources` module, so
loading a config (`yoloedge check`) loads none of them; whether an optional module is installed
is looked up without importing it (`runtime.module_installed`). Only config/, model and the root
foundation modules may be imported here.

A synthetic camera's image is checked by its signature against the formats OpenCV's imgcodecs
decodes (`IMAGE_SIGNATURES`), as cv2.haveImageReader does, without loading OpenCV
(tests/test_capture.py holds the two side by side).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from enum import Enum
from typing import Callable
from urllib.parse import quote, unquote

from ..redact import MASK, SECRETS, redact_text
from ..runtime import module_installed

# -- decoder: --------------------------------------------------------------------------------------


class Decoder(str, Enum):
    """`decoder:` of a camera. OPENCV is FFmpeg inside OpenCV (no GStreamer at all)."""

    OPENCV = "opencv"
    PYAV = "pyav"  # FFmpeg through PyAV: no OpenCV picture in between (sources.pyav)
    GSTREAMER = "gstreamer"  # software decoders, through GStreamer
    JETSON = "jetson"  # nvv4l2decoder (NVIDIA Jetson)
    VAAPI = "vaapi"  # VA-API (AMD, Intel)
    NVIDIA = "nvidia"  # NVDEC (NVIDIA discrete GPUs)
    #: the Atlas card's own media engine (VDEC for H.264/H.265, JPEGD for JPEG), on an
    #: accelerator group of `backend: ascend`; the host only demultiplexes (sources.demux)
    DVPP = "dvpp"
    AUTO = "auto"  # the best of the above that this machine has (dvpp on an Ascend group whose model takes it)

    def __str__(self) -> str:
        return self.value

    @property
    def uses_gstreamer(self) -> bool:
        """Whether this choice needs PyGObject whatever the machine (AUTO falls back to OpenCV)."""
        return self not in (Decoder.OPENCV, Decoder.PYAV, Decoder.DVPP, Decoder.AUTO)


DECODERS = tuple(d.value for d in Decoder)

#: the pip extra that installs PyGObject; named in every message about a missing `gi`
GSTREAMER_EXTRA = "pip install yoloedge[gstreamer]"
GSTREAMER_HINT = (f"{GSTREAMER_EXTRA} (PyGObject; building it needs libgirepository1.0-dev and libcairo2-dev), "
                  "with GStreamer's system packages gir1.2-gstreamer-1.0, gstreamer1.0-plugins-good, "
                  "gstreamer1.0-plugins-bad and gstreamer1.0-libav")

#: the pip extra that installs PyAV; named in every message about a missing `av`
PYAV_EXTRA = "pip install yoloedge[pyav]"
PYAV_HINT = f"{PYAV_EXTRA} (PyAV: FFmpeg's own libraries in the wheel, no system packages needed)"


def gi_installed() -> bool:
    """Whether PyGObject can be imported, without importing it."""
    return module_installed("gi")


def av_installed() -> bool:
    """Whether PyAV can be imported, without importing it (it loads FFmpeg's libraries)."""
    return module_installed("av")


# -- `pipeline:` launch strings --------------------------------------------------------------------

_SCHEME_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: an element property that holds a credential outside any URL: rtspsrc's and souphttpsrc's
#: user-id/user-pw/proxy-id/proxy-pw, srtsrc's passphrase, and any *password, *passwd, *secret,
#: *token. The user names too, as a URL's user-info is hidden whole. Value: quoted, or to white space.
_CREDENTIAL_PROPERTY = re.compile(
    r"""(?<![^\s])((?:user|proxy)-id|[\w-]*(?:-pw|passphrase|password|passwd|secret|token))="""
    r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|\S+)""",
    re.IGNORECASE)


def split_links(launch: str) -> list[str]:
    """The launch string cut at every '!' that is not inside quotes (gst-launch syntax)."""
    parts: list[str] = []
    current: list[str] = []
    quote_char, escaped = "", False
    for char in launch:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif quote_char:
            quote_char = "" if char == quote_char else quote_char
        elif char in "\"'":
            quote_char = char
        elif char == "!":
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [part.strip() for part in parts]


def launch_problem(launch: str) -> str | None:
    """Why `launch` cannot be a camera's pipeline (without GStreamer: the text only), or None."""
    last = split_links(launch)[-1].split()
    if not last or last[0] != "appsink":
        return "must end in an appsink (the frames come out of it)"
    return None


def launch_urls(launch: str) -> list[str]:
    """The URLs inside a launch string; a quoted one up to its closing quote (a password may
    hold spaces), else up to the next white space."""
    urls = []
    for match in _SCHEME_START.finditer(launch):
        start = match.start()
        quote_char = launch[start - 1] if start > 0 and launch[start - 1] in "\"'" else ""
        end = launch.find(quote_char, match.end()) if quote_char else -1
        if end == -1:
            space = re.search(r"\s", launch[match.end():])
            end = match.end() + space.start() if space else len(launch)
        urls.append(launch[start:end])
    return urls


def register_launch_secrets(launch: str) -> None:
    """Register the credentials of every URL in a launch string, as camera URLs are, and the
    values of its credential properties (`user-pw=`): before any check, so no message about the
    pipeline can quote them."""
    for url in launch_urls(launch):
        SECRETS.add_url(url)
    for match in _CREDENTIAL_PROPERTY.finditer(launch):
        if not match.group(1).lower().endswith("-id"):  # a bare user name ("admin") is not scrubbed
            SECRETS.add_secret(_unquote(match.group(2)))  # from every log line, as in url_secrets


def _unquote(value: str) -> str:
    """A launch-string value as the element receives it: quotes off, backslash escapes undone."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def display_launch(launch: str) -> str:
    """A launch string as logs and status show it (secrets registered first); a credential
    property's value is `***` whatever its length (one too short to register is still hidden)."""
    register_launch_secrets(launch)
    return redact_text(_CREDENTIAL_PROPERTY.sub(lambda m: f"{m.group(1)}={MASK}", launch))


# -- synthetic:// URLs -----------------------------------------------------------------------------

SYNTHETIC_SCHEME = "synthetic://"
#: largest synthetic frame side (8K is 7680x4320); a typo must not allocate gigabytes
SYNTHETIC_MAX_SIDE = 8192
_SYNTHETIC_SIZE = re.compile(r"^([0-9]+)[xX]([0-9]+)$")
#: a frame rate outside this range is a container default or garbage, not information; a
#: synthetic camera's fps must be inside it
PLAUSIBLE_FPS = (0.1, 1000.0)


class SyntheticUrlError(ValueError):
    """A synthetic URL that can never work; the message says what is wrong, never quotes credentials."""


@dataclass(frozen=True)
class SyntheticSpec:
    """What `synthetic://WIDTHxHEIGHT?fps=F[&image=PATH]` asks for."""

    width: int
    height: int
    fps: float
    image: str | None = None  # None: a generated textured frame

    @property
    def url(self) -> str:
        """The URL in canonical form (the image path percent-encoded where needed)."""
        fps = f"{self.fps:.15g}"
        image = "" if self.image is None else "&image=" + quote(self.image, safe="/")
        return f"{SYNTHETIC_SCHEME}{self.width}x{self.height}?fps={fps}{image}"


def parse_synthetic_url(url: str) -> SyntheticSpec:
    """Read `synthetic://WIDTHxHEIGHT?fps=F&image=PATH`; raises SyntheticUrlError saying what is
    wrong (it can never work, so retrying is pointless). `image` is optional and percent-decoded
    ('+' stays a plus: it is a path, not a form value); a relative path is left as it is (the
    config resolves it from the config file's folder)."""
    if not url.lower().startswith(SYNTHETIC_SCHEME):
        raise SyntheticUrlError(f"a synthetic URL starts with {SYNTHETIC_SCHEME}")
    size, _, query = url[len(SYNTHETIC_SCHEME):].partition("?")
    match = _SYNTHETIC_SIZE.match(size)
    width, height = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if not (1 <= width <= SYNTHETIC_MAX_SIDE and 1 <= height <= SYNTHETIC_MAX_SIDE):
        shown = f", not {size!r}" if "@" not in size else ""  # never echo what looks like credentials
        raise SyntheticUrlError(f"the size must be WIDTHxHEIGHT in pixels, each 1 to {SYNTHETIC_MAX_SIDE}{shown}")
    params = _synthetic_params(query)
    if "fps" not in params:
        raise SyntheticUrlError("fps=F is missing: the frames per second to deliver")
    low, high = PLAUSIBLE_FPS
    try:
        fps = float(params["fps"])
    except ValueError:
        fps = math.nan
    if not low <= fps <= high:  # also NaN
        raise SyntheticUrlError(f"fps must be a number from {low:g} to {high:g}, not {params['fps']!r}")
    image = params.get("image")
    if image is not None and not image.strip():
        raise SyntheticUrlError("image= is empty: give an image file, or leave image out for a generated frame")
    return SyntheticSpec(width, height, fps, image)


def _synthetic_params(query: str) -> dict[str, str]:
    """fps= and image= of the query, percent-decoded; anything else, or either twice, is refused."""
    params: dict[str, str] = {}
    for part in query.split("&") if query else ():
        key, sep, value = part.partition("=")
        if key not in ("fps", "image") or not sep:
            raise SyntheticUrlError(f"unknown parameter {key!r}: only fps=F and image=PATH")
        if key in params:
            raise SyntheticUrlError(f"{key} is given twice")
        params[key] = unquote(value)
    return params


def _webp(head: bytes) -> bool:
    return head[:4] == b"RIFF" and head[8:12] == b"WEBP"


def _pnm(head: bytes) -> bool:
    """P1-P6 (PBM, PGM, PPM), P7 (PAM), Pf/PF (PFM), each followed by white space."""
    return len(head) >= 3 and head[:1] == b"P" and head[1:2] in b"1234567fF" and head[2:3].isspace()


def _avif(head: bytes) -> bool:
    """An ISO BMFF `ftyp` box whose major brand is AVIF (a still image or a sequence)."""
    return head[4:8] == b"ftyp" and head[8:12] in (b"avif", b"avis")


#: the file signatures of the image formats OpenCV's imgcodecs decodes (each decoder's own
#: checkSignature): JPEG, PNG, BMP, TIFF (and BigTIFF), WebP, PNM/PAM/PFM, Sun raster, Radiance
#: HDR, JPEG 2000 (JP2 and the codestream), GIF and AVIF (OpenCV 4.11 and later), OpenEXR (the 4.x
#: wheels). A prefix, or a test of the first bytes. Builds differ in a format or two; this is their
#: union, so a file only a newer OpenCV reads is not refused (its decode still fails at run time).
IMAGE_SIGNATURES: tuple[bytes | Callable[[bytes], bool], ...] = (
    b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM", b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+",
    _webp, _pnm, b"\x59\xa6\x6a\x95", b"#?RADIANCE", b"#?RGBE", b"\x00\x00\x00\x0cjP  \r\n\x87\n",
    b"\xff\x4f\xff\x51", b"GIF87a", b"GIF89a", _avif, b"\x76\x2f\x31\x01",
)
_SIGNATURE_BYTES = 32


def looks_like_image(head: bytes) -> bool:
    """Whether `head`, the first bytes of a file, starts as an image OpenCV decodes."""
    for signature in IMAGE_SIGNATURES:
        if head.startswith(signature) if isinstance(signature, bytes) else signature(head):
            return True
    return False


def synthetic_image_problem(path: str) -> str | None:
    """Why `path` cannot be a synthetic camera's image, or None. Reads the file's signature only."""
    if not os.path.exists(path):
        return f"image not found: {path}"
    if not os.path.isfile(path):
        return f"image is not a file: {path}"
    try:
        with open(path, "rb") as file:
            head = file.read(_SIGNATURE_BYTES)
    except OSError:
        head = b""  # unreadable: as OpenCV, which cannot read its signature either
    if not looks_like_image(head):
        return f"not an image OpenCV can read: {path}"
    return None


# -- jpeg_decoder: ---------------------------------------------------------------------------------


class JpegDecoderKind(str, Enum):
    AUTO = "auto"
    NVIMGCODEC = "nvimgcodec"
    NVJPEG = "nvjpeg"
    CPU = "cpu"

    def __str__(self) -> str:
        return self.value


#: the values of the `jpeg_decoder` camera key
JPEG_DECODERS = tuple(kind.value for kind in JpegDecoderKind)
#: the module each GPU decoder is imported as
MODULES = {JpegDecoderKind.NVIMGCODEC: "nvidia.nvimgcodec", JpegDecoderKind.NVJPEG: "nvjpeg"}
INSTALL_HINTS = {
    JpegDecoderKind.NVIMGCODEC: "pip install nvidia-nvimgcodec-cu12 (CUDA 13: nvidia-nvimgcodec-cu13; "
                                "Jetson: nvidia-nvimgcodec-tegra-cu12)",
    JpegDecoderKind.NVJPEG: "pip install pynvjpeg (it builds from source: needs the CUDA toolkit with nvJPEG)",
}


def jpeg_decoder_installed(kind: JpegDecoderKind) -> bool:
    """Whether the decoder's module can be found, without importing it (no CUDA start-up): what
    the config check asks. The CPU decoder (OpenCV) and `auto` always are."""
    if kind is JpegDecoderKind.CPU or kind is JpegDecoderKind.AUTO:
        return True
    return module_installed(MODULES[kind])

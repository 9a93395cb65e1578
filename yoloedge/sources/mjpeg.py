"""HTTP MJPEG cameras read as JPEG bytes, so that a GPU decoder (see `jpeg`) can decode them.

OpenCV reads an MJPEG camera through FFmpeg, which decodes every frame on the CPU and never hands
out the JPEG. When a camera's `jpeg_decoder` is a GPU decoder, this module reads the
`multipart/x-mixed-replace` stream itself with http.client: one HTTP GET, then one part per frame,
each a JPEG with its own small header block.

Everything a camera sends is bounded: the response and part headers (line length and count), the
bytes skipped looking for a boundary, and each part (`MAX_PART_BYTES`, checked against its
Content-Length before reading it, or while reading a part without one). Every wait is bounded by
the camera's open and read timeouts as totals, as OpenCV bounds FFmpeg's (an interrupt deadline per
open and per frame): the connection and the response head must arrive within the open timeout, and
each whole part within the read timeout. A timeout per receive alone would let a camera that
trickles a byte at a time hold a read forever -- and with it the connection thread the reader
abandoned, one more at every reconnect.

A camera that names no boundary in its Content-Type is still read: the first line that starts with
"--" is taken as the boundary (FFmpeg's MJPEG demuxer, by default, takes any such line). As with
FFmpeg, credentials come from the URL's user-info (`http://user:password@host/...`, percent-encoded)
and are sent as HTTP Basic authentication; an https:// camera's certificate is not verified
(FFmpeg's default, tls_verify=0: cameras mostly have self-signed ones). Errors name the camera by
its redacted URL, never the credentials.
"""

from __future__ import annotations

import base64
import http.client
import io
import math
import socket
import ssl
import time
from typing import Callable
from urllib.parse import unquote, urlsplit

import numpy as np

from ..errors import ImageError
from ..redact import redact_url
from ..textsafe import printable
from .base import Source, SourceError, SourceKind
from .imagesize import DEFAULT_LIMITS, ImageLimits, ImageTooLarge
from .jpeg import JpegDecoder, decode

#: the largest part (one JPEG) read: 8K at the highest quality is about 20 MB
MAX_PART_BYTES = 32 * 1024 * 1024
MAX_HEADER_LINE = 8192
MAX_PART_HEADERS = 64
#: bytes skipped between parts while looking for the next boundary
MAX_SKIP_BYTES = 1024 * 1024
#: consecutive parts that do not decode before the stream is given up as not a JPEG camera
MAX_BAD_PARTS = 25
_READ_CHUNK = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: the longest boundary line learnt from the stream: RFC 2046 allows 70 characters after the "--"
_MAX_BOUNDARY_LINE = 72
#: http.client's own errors for what the camera sent, said in words (their texts may quote the request)
_HTTP_ERRORS = {
    "LineTooLong": "a header line longer than http.client accepts",
    "RemoteDisconnected": "the camera closed the connection without an answer",
    "BadStatusLine": "the answer is not HTTP",
    "IncompleteRead": "the answer ended early",
    "HTTPException": "the answer's header is malformed or has too many lines",
}


class NotMjpegError(SourceError):
    """The URL answers, but not with multipart/x-mixed-replace (an H.264 stream, an HLS playlist,
    a single snapshot): FFmpeg can still read it."""


class _DeadlineReader(io.RawIOBase):
    """The socket as http.client reads it, each receive bounded by the time left until `deadline`
    (and by `timeout_s`): a camera that trickles a byte at a time satisfies every receive timeout."""

    def __init__(self, sock: socket.socket, clock: Callable[[], float]):
        self._sock = sock
        self._clock = clock
        self.timeout_s = math.inf
        self.deadline = math.inf

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - io's buffer type
        left = min(self.timeout_s, self.deadline - self._clock())
        if left <= 0:
            raise TimeoutError("deadline passed")
        self._sock.settimeout(left)
        return self._sock.recv_into(buffer)


class _DeadlineSocket:
    """The connection's socket for http.client: the response reads it through a `_DeadlineReader`.
    Closing is left to `MjpegStream.close` (the connection lets go of its socket while the
    response still reads it)."""

    def __init__(self, sock: socket.socket, reader: _DeadlineReader):
        self._sock = sock
        self._reader = reader

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(self._reader)

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> object:
        return getattr(self._sock, name)


class MjpegStream:
    """One HTTP connection to an MJPEG camera; `next_part()` returns each frame's bytes.
    `clock` (monotonic seconds) is injectable for tests."""

    def __init__(self, url: str, open_timeout_s: float, read_timeout_s: float,
                 max_part_bytes: int = MAX_PART_BYTES, *, clock: Callable[[], float] = time.monotonic):
        self.description = redact_url(url)
        self._open_timeout_s = open_timeout_s
        self._read_timeout_s = read_timeout_s
        self._max_part_bytes = max_part_bytes
        self._clock = clock
        self._conn = _connect(url, open_timeout_s)
        self._sock: socket.socket | None = None
        self._reader: _DeadlineReader | None = None
        self._response: http.client.HTTPResponse | None = None
        self._at_boundary = False  # the last read ended on a boundary line (a part without Content-Length)
        self._boundary: tuple[bytes, bytes] | None = None  # None: not named, learnt from the first part
        try:
            self._response = self._get(url)
            self._boundary = self._check_response(self._response)
        except BaseException:
            self.close()
            raise

    def _get(self, url: str) -> http.client.HTTPResponse:
        parts = urlsplit(url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        headers = {"User-Agent": "yoloedge", "Accept": "*/*"}
        if parts.username is not None:
            token = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(token).decode("ascii")
        started = self._clock()
        try:
            self._conn.connect()
            sock = self._conn.sock
            if sock is None:
                raise SourceError(f"{self.description}: cannot open stream: no connection")
            self._sock = sock
            self._reader = _DeadlineReader(sock, self._clock)
            self._reader.deadline = started + self._open_timeout_s  # the whole response head
            self._conn.sock = _DeadlineSocket(sock, self._reader)
            self._conn.request("GET", target, headers=headers)
            return self._conn.getresponse()
        except TimeoutError:
            raise SourceError(f"{self.description}: cannot open stream: no answer in "
                              f"{self._open_timeout_s:g} s (open timed out)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise SourceError(f"{self.description}: cannot open stream: {_reason(exc)}") from None

    def _check_response(self, response: http.client.HTTPResponse) -> tuple[bytes, bytes] | None:
        """The boundary line's two accepted forms (None when the camera names none); SourceError
        for a refusal, NotMjpegError for another kind of stream."""
        status = response.status
        if status == 401:
            scheme = (response.getheader("WWW-Authenticate") or "").split(" ", 1)[0]
            extra = "" if scheme.lower() in ("", "basic") else \
                f"; the camera asks for {scheme} authentication, and only Basic is sent (jpeg_decoder: cpu reads " \
                f"through FFmpeg, which also does Digest)"
            raise SourceError(f"{self.description}: HTTP 401: user name or password refused{extra}")
        if status in _REDIRECTS:
            raise SourceError(f"{self.description}: HTTP {status}: the camera redirects elsewhere; "
                              f"give the address it redirects to")
        if status != 200:
            raise SourceError(f"{self.description}: HTTP {status} {printable(response.reason[:100])}")
        content_type = response.headers.get_content_type()
        if content_type != "multipart/x-mixed-replace":
            raise NotMjpegError(f"{self.description}: not an MJPEG stream (Content-Type {content_type[:100]})")
        boundary = response.headers.get_param("boundary")
        if not isinstance(boundary, str) or not boundary.strip().strip('"'):
            return None  # learnt from the first boundary line (`_is_boundary`)
        name = boundary.strip().strip('"').encode("latin-1", "replace")
        # RFC 2046 puts "--" before the boundary; some cameras already include it in the parameter
        return b"--" + name, name

    # -- parts -----------------------------------------------------------------------------------
    def next_part(self) -> bytes | None:
        """The next frame's bytes; None when the camera closed the stream. SourceError for a
        broken or oversized part, a timeout or a lost connection."""
        if self._reader is not None:
            self._reader.timeout_s = self._read_timeout_s
            self._reader.deadline = self._clock() + self._read_timeout_s  # the whole part
        try:
            if not self._skip_to_boundary():
                return None
            length = self._part_length(self._read_headers())
            if length is not None:
                return self._read_exact(length)
            return self._read_to_boundary()
        except TimeoutError:
            raise SourceError(f"{self.description}: no whole frame in {self._read_timeout_s:g} s "
                              f"(read timed out)") from None
        except (OSError, http.client.HTTPException) as exc:
            raise SourceError(f"{self.description}: read failed: {_reason(exc)}") from None

    def _readline(self, limit: int) -> bytes:
        if self._response is None:
            raise SourceError(f"{self.description}: stream closed")
        return self._response.readline(limit)

    def _is_boundary(self, line: bytes) -> bool | None:
        """True for a boundary line, None for the closing one, False for anything else. A stream
        without a named boundary takes the first line that could be one."""
        text = line.strip()
        if self._boundary is None:
            if not (text.startswith(b"--") and 2 < len(text) <= _MAX_BOUNDARY_LINE):
                return False
            self._boundary = (text, text[2:])
        if text in self._boundary:
            return True
        if text.endswith(b"--") and text[:-2] in self._boundary:
            return None
        return False

    def _skip_to_boundary(self) -> bool:
        if self._at_boundary:
            self._at_boundary = False
            return True
        skipped = 0
        while skipped <= MAX_SKIP_BYTES:
            line = self._readline(MAX_HEADER_LINE)
            if not line:
                return False
            found = self._is_boundary(line)
            if found is None:
                return False
            if found:
                return True
            skipped += len(line)
        raise SourceError(f"{self.description}: no part boundary in {MAX_SKIP_BYTES:,} bytes")

    def _read_headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for _ in range(MAX_PART_HEADERS):
            line = self._readline(MAX_HEADER_LINE + 1)
            if len(line) > MAX_HEADER_LINE:
                raise SourceError(f"{self.description}: a part header line over {MAX_HEADER_LINE} bytes")
            if not line:
                raise SourceError(f"{self.description}: stream ended inside a part header")
            if not line.strip():
                return headers
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        raise SourceError(f"{self.description}: more than {MAX_PART_HEADERS} header lines in a part")

    def _part_length(self, headers: dict[str, str]) -> int | None:
        text = headers.get("content-length")
        if text is None:
            return None
        if not text.isdigit():
            raise SourceError(f"{self.description}: a part's Content-Length is not a number")
        length = int(text)
        if length > self._max_part_bytes:
            raise SourceError(f"{self.description}: a part of {length:,} bytes, over the bound of "
                              f"{self._max_part_bytes:,} bytes")
        return length

    def _read_exact(self, length: int) -> bytes:
        response = self._response
        if response is None:
            raise SourceError(f"{self.description}: stream closed")
        data = response.read(length)
        if len(data) < length:
            raise SourceError(f"{self.description}: stream ended inside a frame")
        return data

    def _read_to_boundary(self) -> bytes:
        """A part without Content-Length: everything up to the next boundary line. Collected in one
        buffer: a list of its lines would cost some 50 bytes per line, 25 times the part for one
        made of short lines."""
        data = bytearray()
        while True:
            line = self._readline(_READ_CHUNK)
            if not line:
                raise SourceError(f"{self.description}: stream ended inside a frame")
            found = self._is_boundary(line) if line.startswith(b"--") else False
            if found is not False:
                self._at_boundary = found is True
                end = len(data) - (2 if data.endswith(b"\r\n") else 1 if data.endswith(b"\n") else 0)
                del data[end:]
                return bytes(data)
            if len(data) + len(line) > self._max_part_bytes:
                raise SourceError(f"{self.description}: a part over the bound of {self._max_part_bytes:,} bytes")
            data += line

    def close(self) -> None:
        response, self._response = self._response, None
        if response is not None:
            response.close()
        self._conn.close()
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()


def _connect(url: str, open_timeout_s: float) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise SourceError(f"{redact_url(url)}: the port is not a number") from None
    host = parts.hostname
    if not host:
        raise SourceError(f"{redact_url(url)}: no host name")
    if parts.scheme.lower() == "https":
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # as FFmpeg (tls_verify=0): see the module docstring
        return http.client.HTTPSConnection(host, port, timeout=open_timeout_s, context=context)
    return http.client.HTTPConnection(host, port, timeout=open_timeout_s)


def _reason(exc: BaseException) -> str:
    """Why a request or read failed, without quoting what the camera or the URL said (an
    http.client message may carry the request target, query string and all)."""
    if isinstance(exc, socket.timeout):
        return "timed out"
    if isinstance(exc, http.client.HTTPException):
        name = type(exc).__name__
        return _HTTP_ERRORS.get(name, name)
    text = getattr(exc, "strerror", None) or str(exc).strip()
    return (text or type(exc).__name__).splitlines()[0][:200]


class MjpegSource(Source):
    """An HTTP MJPEG camera whose JPEGs `decoder` decodes.

    A part that does not decode is skipped and counted (`skipped`), as a folder skips a bad
    image; `MAX_BAD_PARTS` of them in a row end the connection (the camera sends no JPEGs). A
    part whose header declares more pixels than `limits` allows ends it before decoding, as an
    oversized frame of any stream does.
    """

    kind = SourceKind.HTTP
    is_live = True

    def __init__(self, url: str, decoder: JpegDecoder, open_timeout_s: float, read_timeout_s: float,
                 camera: str | None = None, limits: ImageLimits = DEFAULT_LIMITS):
        super().__init__(redact_url(url), camera)
        self._decoder = decoder
        self.jpeg_decoder = decoder.kind.value
        self._limits = limits
        self._stream: MjpegStream | None = MjpegStream(url, open_timeout_s, read_timeout_s,
                                                       min(MAX_PART_BYTES, limits.max_bytes))
        self._bad_in_row = 0

    def read(self) -> np.ndarray | None:
        while True:
            stream = self._stream
            if stream is None:
                self.error = "source released"
                return None
            try:
                data = stream.next_part()
            except SourceError as exc:
                self.error = str(exc)
                return None
            if data is None:
                self.error = f"{self.description}: the camera closed the stream"
                return None
            try:
                image = decode(data, self.description, self._decoder, self._limits)
            except ImageTooLarge as exc:
                self.error = f"a frame of {exc}"
                return None
            except ImageError as exc:
                if not self._skip(str(exc)):
                    return None
                continue
            self._bad_in_row = 0
            return image

    def _skip(self, reason: str) -> bool:
        """Count an undecodable part; False (and `error` set) once too many came in a row."""
        self.skipped += 1
        self._bad_in_row += 1
        if self._bad_in_row >= MAX_BAD_PARTS:
            self.error = f"{MAX_BAD_PARTS} frames in a row could not be decoded (the last: {reason})"
            return False
        if self.skipped == 1 or self.skipped % 100 == 0:
            self._warn("%s, skipped (%d so far)", reason, self.skipped)
        return True

    def release(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

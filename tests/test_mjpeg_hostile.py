"""The MJPEG reader (`sources.mjpeg`) against cameras that misbehave, on a real loopback socket.

Each test scripts a tiny HTTP server byte by byte: odd but legal streams (a quoted boundary, none at
all, chunked transfer, parts without Content-Length) must give the frames; hostile or broken ones
(huge or endless headers, a trickle of one byte at a time, a 100 MB part, refusals, a reset in the
middle of a frame) must end in bounded memory and time with a SourceError that says what happened
and never quotes the credentials. Decoding is OpenCV's (`CpuJpegDecoder`): what is tested here is
the reading.
"""

from __future__ import annotations

import base64
import importlib
import logging
import sys
import socket
import ssl
import struct
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import pytest

from yoloedge.sources.base import SourceError
from yoloedge.sources.jpeg import CpuJpegDecoder
from tls_files import make_tls_files
from yoloedge.config.schema import CameraConfig
from yoloedge.sources import CameraReader
from yoloedge.sources.mjpeg import MjpegSource, MjpegStream, NotMjpegError

SECRET = "s3cret-pw"
USER = "viewer"
Script = Callable[[socket.socket], None]


def jpeg(value: int) -> bytes:
    image = np.full((48, 64, 3), value, np.uint8)
    image[8:24, 8:40] = (255 - value, value // 2, 30)
    return cv2.imencode(".jpg", image)[1].tobytes()


FRAMES = [jpeg(40), jpeg(200)]


class ScriptedCamera:
    """Accepts connections on 127.0.0.1 and runs `script(conn)` for each, after reading the request
    head (kept in `requests`). The script writes whatever bytes it likes, then the socket closes."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None):
        self.script = script
        self.tls = tls
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{USER}:{SECRET}@127.0.0.1:{self._listener.getsockname()[1]}/video.cgi?token={SECRET}"

    def __enter__(self) -> ScriptedCamera:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        if self.tls is not None:
            conn.settimeout(5)
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        with conn:
            conn.settimeout(5)
            head = b""
            while b"\r\n\r\n" not in head:
                data = conn.recv(4096)
                if not data:
                    return
                head += data
            self.requests.append(head)
            try:
                self.script(conn)
            except OSError:
                pass  # the client went away: what several tests do on purpose

    def stopped(self) -> bool:
        return self._stop.is_set()


def head(content_type: str = "multipart/x-mixed-replace; boundary=frame", extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n{extra}\r\n".encode()


def part(data: bytes, boundary: bytes = b"--frame", length: bool = True) -> bytes:
    size = f"Content-Length: {len(data)}\r\n".encode() if length else b""
    return boundary + b"\r\nContent-Type: image/jpeg\r\n" + size + b"\r\n" + data + b"\r\n"


def decoded(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)


def open_stream(camera: ScriptedCamera, **kwargs) -> MjpegStream:
    kwargs.setdefault("open_timeout_s", 5)
    kwargs.setdefault("read_timeout_s", 5)
    return MjpegStream(camera.url, **kwargs)


def expect_error(camera: ScriptedCamera, match: str, **kwargs) -> str:
    """Open the stream and read parts until the SourceError; returns its text, checked for `match`
    and for the credentials."""
    with pytest.raises(SourceError, match=match) as info:
        stream = open_stream(camera, **kwargs)
        try:
            for _ in range(4):
                stream.next_part()
        finally:
            stream.close()
    text = str(info.value)
    assert SECRET not in text and USER not in text, text
    return text


@pytest.fixture(autouse=True)
def no_credentials_in_the_log(caplog):
    caplog.set_level(logging.DEBUG)
    yield
    assert SECRET not in caplog.text and USER not in caplog.text


# -- odd but legal streams: the frames ----------------------------------------------------------------
@pytest.mark.parametrize("content_type, boundary", [
    ('multipart/x-mixed-replace; boundary="frame"', b"--frame"),  # quoted
    ("multipart/x-mixed-replace;boundary=--frame", b"--frame"),  # the "--" already in the parameter
    ("multipart/x-mixed-replace", b"--myboundary"),  # no boundary named: FFmpeg reads these
    ("multipart/x-mixed-replace; boundary=", b"--myboundary"),
])
def test_boundary_forms_give_the_frames(content_type, boundary):
    def script(conn):
        conn.sendall(head(content_type) + b"".join(part(f, boundary) for f in FRAMES) + boundary + b"--\r\n")

    with ScriptedCamera(script) as camera:
        stream = open_stream(camera)
        assert [stream.next_part() for _ in FRAMES] == FRAMES
        assert stream.next_part() is None
        stream.close()
    token = base64.b64encode(f"{USER}:{SECRET}".encode())
    assert b"Authorization: Basic " + token in camera.requests[0]


@pytest.mark.parametrize("length", [True, False])
def test_chunked_transfer_encoding_gives_the_frames(length):
    """Chunks cut across part headers, boundaries and JPEG bytes."""
    body = b"".join(part(f, length=length) for f in FRAMES) + b"--frame\r\n"

    def script(conn):
        conn.sendall(head(extra="Transfer-Encoding: chunked\r\n"))
        for at in range(0, len(body), 97):
            piece = body[at:at + 97]
            conn.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        conn.sendall(b"0\r\n\r\n")

    with ScriptedCamera(script) as camera:
        stream = open_stream(camera)
        assert [stream.next_part() for _ in FRAMES] == FRAMES
        stream.close()


def test_parts_without_length_made_of_short_lines_stay_within_bounds():
    """A part without Content-Length is read line by line up to the next boundary: 300 k lines of
    two bytes each must cost about the part's size, not 25 times it (a bytes object per line)."""
    lines = b"a\n" * 300_000

    def script(conn):
        conn.sendall(head() + part(lines, length=False) + part(FRAMES[0], length=False) + b"--frame--\r\n")

    with ScriptedCamera(script) as camera:
        stream = open_stream(camera, max_part_bytes=1_000_000)
        tracemalloc.start()
        try:
            got = stream.next_part()
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert got == lines  # less the CRLF before the boundary, which belongs to the boundary
        assert stream.next_part() == FRAMES[0]
        stream.close()
    assert peak < 4 * len(lines), f"reading a {len(lines):,}-byte part took {peak:,} bytes"


# -- refusals and other kinds of answer -------------------------------------------------------------
@pytest.mark.parametrize("answer, match", [
    (b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Digest realm=\"cam\", nonce=\"1\"\r\n\r\n",
     "HTTP 401: user name or password refused; the camera asks for Digest"),
    (b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", "HTTP 404 Not Found"),
    # a reason phrase is the camera's text: terminal escapes in it must not reach the log as such
    (b"HTTP/1.1 503 Busy\x1b[2J\r\nContent-Length: 0\r\n\r\n", r"HTTP 503 Busy\\x1b\[2J$"),
    (f"HTTP/1.1 302 Found\r\nLocation: http://{USER}:{SECRET}@10.0.0.9/x\r\n\r\n".encode(),
     "HTTP 302: the camera redirects elsewhere"),
    (b"RTSP/1.0 200 OK\r\n\r\n", "cannot open stream: the answer is not HTTP"),
    (b"HTTP/1.1 200 OK\r\nX-Long: " + b"y" * 70_000 + b"\r\n\r\n", "cannot open stream: a header line longer"),
    (b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", "cannot open stream: .*too many lines"),
    (b"", "cannot open stream: the camera closed the connection without an answer"),
])
def test_refusals_and_broken_answers_are_clear_errors(answer, match):
    with ScriptedCamera(lambda conn: conn.sendall(answer)) as camera:
        expect_error(camera, match)


def test_another_kind_of_stream_is_not_mjpeg():
    with ScriptedCamera(lambda conn: conn.sendall(head("video/mp4") + b"\0" * 100)) as camera:
        with pytest.raises(NotMjpegError, match="not an MJPEG stream .Content-Type video/mp4") as info:
            open_stream(camera)
    assert SECRET not in str(info.value)


# -- hostile streams: bounded ---------------------------------------------------------------------------
@pytest.mark.parametrize("body, match", [
    (b"--frame\r\nX-Long: " + b"z" * 20_000 + b"\r\n\r\n", "a part header line over 8192 bytes"),
    (b"--frame\r\n" + b"X-A: b\r\n" * 100, "more than 64 header lines in a part"),
    (b"noise\r\n" * 200_000, "no part boundary in 1,048,576 bytes"),
    (b"--frame\r\nContent-Length: 104857600\r\n\r\n", "a part of 104,857,600 bytes, over the bound"),
    (b"--frame\r\nContent-Length: -5\r\n\r\n", "Content-Length is not a number"),
])
def test_hostile_part_headers_end_the_stream_early(body, match):
    with ScriptedCamera(lambda conn: conn.sendall(head() + body)) as camera:
        expect_error(camera, match)


def test_a_part_without_length_over_the_bound_is_not_read_to_its_end():
    sent = []

    def script(conn):
        conn.sendall(head() + b"--frame\r\n\r\n")
        chunk = b"\xff" * 65536
        for _ in range(100 * 16):  # 100 MB, if the reader takes it
            conn.sendall(chunk)
            sent.append(len(chunk))

    with ScriptedCamera(script) as camera:
        expect_error(camera, "a part over the bound of 2,000,000 bytes", max_part_bytes=2_000_000)
    assert sum(sent) < 20_000_000


def test_a_connection_reset_inside_a_frame_is_a_read_error():
    def script(conn):
        conn.sendall(head() + part(FRAMES[0]) + b"--frame\r\nContent-Length: 5000\r\n\r\n" + FRAMES[1][:100])
        time.sleep(0.2)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST

    with ScriptedCamera(script) as camera:
        stream = open_stream(camera)
        assert stream.next_part() == FRAMES[0]
        with pytest.raises(SourceError, match="read failed: Connection reset|stream ended inside a frame"):
            stream.next_part()
        stream.close()


class Ticks:
    """A clock that advances `step` seconds each time it is read: time passes per receive."""

    def __init__(self, step: float):
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def trickle(data: bytes, camera_stopped: Callable[[], bool]) -> Script:
    def script(conn):
        conn.sendall(head())
        for byte in data:
            if camera_stopped():
                return
            conn.sendall(bytes([byte]))
            time.sleep(0.01)
    return script


def test_a_camera_trickling_a_frame_byte_by_byte_times_out_on_the_frame_not_never():
    """Slowloris: every receive gets its byte well within the read timeout, so only a deadline
    for the whole part ends the read (and lets an abandoned connection thread return). On the
    injected clock every receive takes 0.1 s: a 3 s read timeout allows some 30 of them, where
    the part has over 800 bytes."""
    slow = trickle(part(FRAMES[0]) * 2, lambda: camera.stopped())
    with ScriptedCamera(slow) as camera:
        text = expect_error(camera, r"no whole frame in 3 s \(read timed out\)", read_timeout_s=3, open_timeout_s=3,
                            clock=Ticks(0.1))
    assert "frame" in text


def test_a_camera_trickling_its_response_head_times_out_on_the_open_timeout():
    def script(conn):
        for byte in b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 90:
            conn.sendall(bytes([byte]))
            time.sleep(0.005)

    with ScriptedCamera(script) as camera:
        expect_error(camera, r"cannot open stream: no answer in 2 s \(open timed out\)", open_timeout_s=2,
                     clock=Ticks(0.1))


def test_the_source_reads_frames_then_reports_the_reset_and_a_new_connection_reads_again():
    """The reader reconnects by opening a new source: each connection here sends one frame, then
    resets; each source gives its frame, then a clear error."""
    def script(conn):
        conn.sendall(head() + part(FRAMES[0]))
        time.sleep(0.1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    with ScriptedCamera(script) as camera:
        for _ in range(2):
            source = MjpegSource(camera.url, CpuJpegDecoder(), 5, 5)
            assert np.array_equal(source.read(), decoded(FRAMES[0]))
            assert source.read() is None
            assert source.error and SECRET not in source.error and "***" in source.error
            source.release()
    assert len(camera.requests) == 2


def test_an_https_camera_gives_its_frames_and_its_trickle_is_bounded_too(tmp_path):
    files = make_tls_files(tmp_path)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)

    def script(conn):
        conn.sendall(head() + b"".join(part(f) for f in FRAMES))

    with ScriptedCamera(script, context) as camera:
        stream = open_stream(camera)
        assert [stream.next_part() for _ in FRAMES] == FRAMES
        stream.close()
    with ScriptedCamera(trickle(part(FRAMES[0]) * 2, lambda: camera.stopped()), context) as camera:
        expect_error(camera, r"no whole frame in 3 s", read_timeout_s=3, clock=Ticks(0.1))


@pytest.fixture
def fake_nvjpeg(tmp_path, monkeypatch):
    """The strict fake pynvjpeg importable (tests/fakes/jpeg, as test_jpeg_decode installs it)."""
    root = tmp_path / "fakes"
    root.mkdir()
    (root / "nvjpeg.py").symlink_to(Path(__file__).resolve().parent / "fakes" / "jpeg" / "nvjpeg.py")
    sys.modules.pop("nvjpeg", None)
    monkeypatch.syspath_prepend(str(root))
    importlib.invalidate_caches()
    yield
    sys.modules.pop("nvjpeg", None)
    importlib.invalidate_caches()


def test_the_reader_reconnects_a_camera_that_resets_after_every_frame(fake_nvjpeg):
    def script(conn):
        conn.sendall(head() + part(FRAMES[1]))
        time.sleep(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    frames: list = []
    with ScriptedCamera(script) as camera:
        config = CameraConfig(name="door", url=camera.url, jpeg_decoder="nvjpeg", open_timeout_s=5,
                              read_timeout_s=5, backoff_initial_s=0.02, backoff_max_s=0.05)
        reader = CameraReader(config, lambda frame, timeout_s: frames.append(frame) or True, stall_timeout_s=5.0)
        reader.start()
        deadline = time.monotonic() + 15
        while len(frames) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        reader.stop()
        reader.join(5)
        stats = reader.stats()
    assert len(frames) >= 3 and stats["reconnects"] >= 2, stats
    assert stats["jpeg_decoder"] == "nvjpeg"
    assert SECRET not in str(stats) and USER not in str(stats)


# -- a camera that changes its resolution ------------------------------------------------------------
def resized(frames: list[bytes], size: tuple[int, int]) -> list[bytes]:
    return [cv2.imencode(".jpg", cv2.resize(cv2.imdecode(np.frombuffer(f, np.uint8), cv2.IMREAD_COLOR), size))[1]
            .tobytes() for f in frames]


def read_camera(config: CameraConfig, until: Callable[[dict, list], bool], timeout_s: float = 15.0):
    """Run a reader on `config` until `until(stats, frames)`; returns (stats, frames)."""
    frames: list = []
    reader = CameraReader(config, lambda frame, timeout: frames.append(frame.image.shape[:2]) or True,
                          stall_timeout_s=5.0)
    reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not until(reader.stats(), frames) and time.monotonic() < deadline:
            time.sleep(0.02)
        return reader.stats(), frames
    finally:
        reader.stop()
        reader.join(5)


def size_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "frames changed size" in r.getMessage()
            or "since this connection" in r.getMessage()]


@pytest.mark.shared
def test_a_resolution_change_mid_stream_is_said_once_per_size(fake_nvjpeg, mjpeg_server_factory, caplog):
    """The MJPEG reader hands each frame over at its own size: the camera alternating between 640x480
    and 320x240 every 5 frames is one warning per new size and connection, naming the camera and both
    sizes, however often it changes; status shows the size and counts the changes."""
    server = mjpeg_server_factory(max_frames=5, fps=30.0)
    server.frames = server.frames + resized(server.frames, (320, 240))
    config = CameraConfig(name="door", url=server.url, jpeg_decoder="nvjpeg", open_timeout_s=5, read_timeout_s=5)
    with caplog.at_level(logging.WARNING, logger="yoloedge.sources.reader"):
        stats, frames = read_camera(config, lambda stats, _: stats["size_changes"] >= 6)
    assert stats["size_changes"] >= 6 and stats["reconnects"] == 0, stats
    assert {(480, 640), (240, 320)} <= set(frames) and stats["frame_size"] in ("640x480", "320x240")
    assert size_warnings(caplog) == [
        "camera door: frames changed size mid-stream, 640x480 to 320x240 (the camera changed its resolution); "
        "they go on at the new size",
        "camera door: frames changed size mid-stream, 320x240 to 640x480 (the camera changed its resolution); "
        "they go on at the new size"]


@pytest.mark.shared
def test_a_resolution_change_through_ffmpeg_is_said_at_the_next_connection(mjpeg_server_factory, caplog):
    """OpenCV's FFmpeg (jpeg_decoder: cpu) scales frames to the size it opened the stream at: the change
    shows when the camera reconnects, and is said then."""
    server = mjpeg_server_factory(max_frames=5, fps=30.0)
    config = CameraConfig(name="gate", url=server.url, jpeg_decoder="cpu", open_timeout_s=5, read_timeout_s=2,
                          backoff_initial_s=0.1, backoff_max_s=0.2)
    switched: list[int] = []

    def switch_once(stats: dict, frames: list) -> bool:
        if len(frames) >= 10 and not switched:
            switched.append(len(frames))
            server.stop()
            server.frames = resized(server.frames, (320, 240))
            server.start()
        return (240, 320) in frames
    with caplog.at_level(logging.WARNING, logger="yoloedge.sources.reader"):
        stats, frames = read_camera(config, switch_once)
    assert stats["reconnects"] >= 1 and stats["frame_size"] == "320x240" and stats["size_changes"] == 1, stats
    assert set(frames) == {(480, 640), (240, 320)}
    assert size_warnings(caplog) == ["camera gate: frames are 320x240 since this connection, 640x480 before (the "
                                     "camera changed its resolution)"]

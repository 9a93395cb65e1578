"""Fixtures that play cameras on loopback: an RTSP server process and an MJPEG HTTP server.

Loaded for every test through `pytest_plugins` in tests/conftest.py. The media come from the
`media` fixture (../shared/testdata/media), so these skip where that is absent.

* `rtsp_server`: the shared H.264 street video, looping, at rtsp://127.0.0.1:PORT/stream, served
  by tests/servers/rtsp_server.py under /usr/bin/python3 (GStreamer via `gi`). The test can
  `kill()` it, `freeze()`/`resume()` it (SIGSTOP/SIGCONT: a camera that hangs without closing its
  connections) and `restart()` it on the same port. `rtsp_server_factory(...)` makes more.
* `mjpeg_server`: the shared indoor video as multipart/x-mixed-replace JPEGs at 15 fps, in-process,
  with `stop()`, `restart()`, `freeze()`, `resume()`. `mjpeg_server_factory(...)` makes more.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import pytest

from conftest import skip_unless_required

from servers.mjpeg_server import MjpegServer, encode_video

SYSTEM_PYTHON = "/usr/bin/python3"
RTSP_SCRIPT = Path(__file__).resolve().parent / "servers" / "rtsp_server.py"
RTSP_VIDEO = "street_people_720p.mp4"  # H.264, 1280x720, 29.97 fps, 314 frames
MJPEG_VIDEO = "indoor_people_480p_mpeg4.avi"  # 640x480, 15 fps, 84 frames
_GI_PROBE = ("import gi; gi.require_version('Gst', '1.0'); gi.require_version('GstRtspServer', '1.0'); "
             "from gi.repository import Gst, GstRtspServer; Gst.init(None)")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (for URLs that must be refused)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class RtspServer:
    """An RTSP server process under the test's control.

    `port` stays the same across `restart()`, so a camera URL keeps working after the "camera"
    comes back. `close()` is safe in any state (also while frozen).
    """

    def __init__(self, video: Path | str, *, loop: bool = True, mount: str = "/stream",
                 test_pattern: bool = False, port: int = 0, start_timeout_s: float = 20.0):
        self.video = str(video)
        self.loop = loop
        self.mount = mount
        self.test_pattern = test_pattern
        self.port = port
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self._stderr = tempfile.TemporaryFile()
        self.frozen = False

    # -- lifecycle
    def start(self) -> "RtspServer":
        command = [SYSTEM_PYTHON, str(RTSP_SCRIPT), "--file", self.video, "--port", str(self.port),
                   "--mount", self.mount]
        command += ["--loop"] if self.loop else []
        command += ["--test-pattern"] if self.test_pattern else []
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self.port = self._wait_ready()
        self.frozen = False
        return self

    def _wait_ready(self) -> int:
        """Read the `READY <port>` line, or fail with the server's stderr."""
        if self.proc is None or self.proc.stdout is None:
            raise RuntimeError("RTSP server process not started")
        deadline = time.monotonic() + self.start_timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if sel.select(timeout=max(0.0, deadline - time.monotonic())):
                    line = self.proc.stdout.readline()
                    if line.startswith("READY "):
                        return int(line.split()[1])
                    if not line:  # the process closed stdout: it died
                        break
        self.kill()
        raise RuntimeError(f"RTSP server did not start: {self.stderr_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: the camera dies and its connections close (clients see the stream end)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.frozen = False

    def freeze(self) -> None:
        """SIGSTOP: the camera hangs; connections stay open but nothing arrives."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGSTOP)
            self.frozen = True

    def resume(self) -> None:
        """SIGCONT after freeze()."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def restart(self) -> "RtspServer":
        """Kill (if running) and start again on the same port."""
        self.kill()
        return self.start()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.frozen:
                self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    # -- facts
    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def url(self, mount: str | None = None, credentials: str | None = None) -> str:
        """rtsp://[credentials@]127.0.0.1:PORT/mount. The server ignores credentials."""
        userinfo = f"{credentials}@" if credentials else ""
        return f"rtsp://{userinfo}127.0.0.1:{self.port}{mount or self.mount}"

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")


@pytest.fixture(scope="session")
def gst_rtsp_available() -> None:
    """Skip unless /usr/bin/python3 can import GStreamer's RTSP server bindings."""
    if not os.path.exists(SYSTEM_PYTHON):
        skip_unless_required(f"{SYSTEM_PYTHON} not found: the RTSP test server needs the Debian python with gi",
                             "YOLOEDGE_REQUIRE_RTSP")
    probe = subprocess.run([SYSTEM_PYTHON, "-c", _GI_PROBE], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        skip_unless_required("the RTSP test server needs python3-gi and gir1.2-gst-rtsp-server-1.0 for "
                             f"{SYSTEM_PYTHON}: {probe.stderr.strip().splitlines()[-1:]}", "YOLOEDGE_REQUIRE_RTSP")


@pytest.fixture
def rtsp_server_factory(media, gst_rtsp_available) -> Callable[..., RtspServer]:
    """make(video=None, *, loop=True, mount="/stream", test_pattern=False, port=0) -> a started
    RtspServer; video defaults to the shared H.264 street clip. All are closed after the test."""
    servers: list[RtspServer] = []

    def make(video: Path | str | None = None, **options) -> RtspServer:
        server = RtspServer(video or media / RTSP_VIDEO, **options)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def rtsp_server(rtsp_server_factory) -> RtspServer:
    """The shared street clip (1280x720, 29.97 fps) looping at rtsp://127.0.0.1:PORT/stream."""
    return rtsp_server_factory()


@pytest.fixture(scope="session")
def _mjpeg_frame_cache() -> dict:
    return {}


@pytest.fixture
def mjpeg_server_factory(media, _mjpeg_frame_cache) -> Callable[..., MjpegServer]:
    """make(video=None, fps=15.0, max_frames=84, port=0) -> a started in-process MjpegServer;
    video defaults to the shared indoor clip (640x480). All are stopped after the test."""
    servers: list[MjpegServer] = []

    def make(video: Path | str | None = None, fps: float = 15.0, max_frames: int = 84, port: int = 0) -> MjpegServer:
        key = (str(video or media / MJPEG_VIDEO), max_frames)
        if key not in _mjpeg_frame_cache:
            _mjpeg_frame_cache[key] = encode_video(key[0], max_frames)
        server = MjpegServer(_mjpeg_frame_cache[key], fps, port)
        servers.append(server)
        return server.start()

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def mjpeg_server(mjpeg_server_factory) -> MjpegServer:
    """The shared indoor clip (640x480) at 15 fps on http://127.0.0.1:PORT/stream.mjpg."""
    return mjpeg_server_factory()

"""What native code writes to fd 2 is redacted too (yoloedge.health.stderr_guard).

FFmpeg and OpenCV print with `fprintf(stderr, ...)`, past Python's logging. The first tests write
to fd 2 from Python and from C (libc `write` and `dprintf`) in a subprocess with the guard installed;
the last runs the real daemon against an RTSP server that echoes the request URL, password and all,
in the reason phrase of its error reply, which FFmpeg prints.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from daemon_harness import REPO, Daemon, NotifySocket, write_config
from yoloedge import demo

SECRET = "G7zSecretPw"

GUARDED_WRITER = f"""
import ctypes, os, sys
from yoloedge.health.stderr_guard import StderrGuard
from yoloedge.redact import SECRETS
SECRETS.add_secret({SECRET!r})
libc = ctypes.CDLL(None)
guard = StderrGuard()
guard.install()
for i in range(300):
    line = f"line {{i}} pw={SECRET} rtsp://admin:{SECRET}@cam/s \\x1b[2J\\n".encode()
    kind = i % 3
    if kind == 0:
        os.write(2, line)
    elif kind == 1:
        libc.write(2, line, len(line))
    else:
        libc.dprintf(2, b"%s", line)
print("python", {SECRET!r}, file=sys.stderr, flush=True)
os.write(2, b"no newline at the end " + {SECRET!r}.encode())
guard.remove()
os.write(2, b"\\nafter\\n")
"""


def run_python(code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, timeout=timeout)


def test_python_and_native_writes_to_fd2_are_redacted_in_order():
    done = run_python(GUARDED_WRITER)
    assert done.returncode == 0, done.stderr[-2000:]
    err = done.stderr.decode()
    assert SECRET not in err
    lines = err.splitlines()
    numbered = [line for line in lines if line.startswith("line ")]
    assert [int(line.split()[1]) for line in numbered] == list(range(300))  # every line, in order
    assert all("pw=***" in line and "rtsp://***@cam/s" in line and "\\x1b[2J" in line for line in numbered)
    assert lines[-3:] == ["python ***", "no newline at the end ***", "after"]


FAILING_READER = """
import os, sys
from yoloedge.health.stderr_guard import StderrGuard
calls = []
def transform(text):
    calls.append(text)
    if len(calls) == 2:
        raise ValueError("broken filter")
    return text.upper()
guard = StderrGuard(transform=transform)
guard.install()
os.write(2, b"first\\n")
os.write(2, b"second\\n")
for _ in range(50):  # the guard restores fd 2 soon after its failure
    if not guard.active:
        break
    import time; time.sleep(0.05)
os.write(2, b"x" * 300000 + b"\\n")  # more than a pipe holds: must not block
guard.remove()
os.write(2, b"done\\n")
"""


def test_a_failed_reader_restores_fd2_instead_of_blocking_writers():
    done = run_python(FAILING_READER, timeout=20)
    err = done.stderr.decode()
    assert done.returncode == 0, err[-2000:]
    assert err.startswith("FIRST\n")
    assert "stderr guard stopped (ValueError)" in err
    assert "x" * 300000 in err and err.endswith("done\n")


LONG_LINE = """
import os
from yoloedge.health.stderr_guard import StderrGuard
guard = StderrGuard(max_line=1000)
guard.install()
os.write(2, b"a" * 5000 + b"\\n" + b"b" * 3000)
os.write(2, b"\\nshort\\n")
guard.remove()
"""


def test_a_line_over_the_limit_is_cut():
    done = run_python(LONG_LINE)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.decode().splitlines() == ["a" * 1000 + " [line cut]", "b" * 1000 + " [line cut]", "short"]


# --- the real daemon and FFmpeg's own error message -----------------------------------------------

class EchoingRtspServer:
    """Answers every RTSP request with `454` and the request line as the reason phrase, as the
    servers do that quote the URL they were asked for."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.requests: list[str] = []
        self._running = True
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while self._running:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                data += chunk
        except OSError:
            return
        head = data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
        self.requests.append(head[0].decode("utf-8", "replace"))
        cseq = next((h.split(b":", 1)[1].strip() for h in head if h.lower().startswith(b"cseq:")), b"1")
        conn.sendall(b"RTSP/1.0 454 Not Found " + head[0] + b"\r\nCSeq: " + cseq + b"\r\n\r\n")

    def stop(self) -> None:
        self._running = False
        self.sock.close()
        self._thread.join(2)


@pytest.fixture()
def echoing_server():
    server = EchoingRtspServer()
    yield server
    server.stop()


def camera_url(port: int) -> str:
    return f"rtsp://127.0.0.1:{port}/user=admin_password={SECRET}_channel=1"


def test_without_the_guard_ffmpeg_prints_the_echoed_password(echoing_server):
    """The premise: FFmpeg itself writes the server's reply, URL and all, to fd 2."""
    code = ("import cv2; c = cv2.VideoCapture(%r, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, 3000]); "
            "print(c.isOpened())" % camera_url(echoing_server.port))
    done = run_python(code)
    assert "OPTIONS failed" in done.stderr.decode() and SECRET in done.stderr.decode()


def test_the_daemon_log_never_shows_an_echoed_password(tmp_path: Path, echoing_server, mosquitto_factory):
    broker = mosquitto_factory()
    config = {
        "device_id": "edge-guard",
        "model": {"path": str(demo.MODEL), "labels": str(demo.LABELS)},
        "accelerators": [{"name": "sim", "backend": "simulated", "batch": 1, "simulated": {"device_ms": [1, 1]}}],
        "cameras": [{"name": "echo", "url": camera_url(echoing_server.port), "open_timeout_s": 2,
                     "read_timeout_s": 2, "backoff_initial_s": 0.2, "backoff_max_s": 0.5}],
        "mqtt": {"host": broker.host, "port": broker.port, "topic_prefix": "yg"},
        "control": {"socket": str(tmp_path / "control.sock")},
        "logging": {"level": "info", "target": "stderr"},
        "shutdown_timeout_s": 5,
    }
    notify = NotifySocket(tmp_path / "notify.sock")
    daemon = Daemon(write_config(tmp_path / "yoloedge.yaml", config), notify)
    try:
        notify.wait_for("READY", "1", timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and daemon.log.count("OPTIONS failed") < 2:
            time.sleep(0.2)
        assert daemon.stop() == 0, daemon.log[-3000:]
    finally:
        daemon.kill()
        notify.close()
    assert any(SECRET in request for request in echoing_server.requests)  # the server did echo it
    assert daemon.log.count("OPTIONS failed") >= 2, daemon.log[-3000:]  # FFmpeg's own message arrived
    assert SECRET not in daemon.log


CRASH = """
import faulthandler
from yoloedge.health.stderr_guard import StderrGuard
StderrGuard().install()
faulthandler._sigsegv()
"""


def test_a_crash_dump_reaches_the_real_stderr():
    """The reader thread dies with the process: faulthandler must not write into its pipe."""
    done = run_python(CRASH)
    assert done.returncode != 0
    assert "Fatal Python error" in done.stderr.decode() and "Segmentation fault" in done.stderr.decode()

"""Hostile text on an operator's terminal: labels, file names and camera errors carrying escape
sequences must reach `yoloedge-ctl status`, `yoloedge detect`, `yoloedge check` and the stderr log
as visible escapes (`\\x1b`), never as the bytes a terminal obeys."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import onnx
import pytest

from conftest import REPO
from daemon_harness import Daemon, NotifySocket, ctl, write_config
from test_hostile_media import png_bomb
from yoloedge import demo
from yoloedge.cli.ctl import format_status
from yoloedge.control.server import ControlServer
from yoloedge.health.logsetup import make_handler
from yoloedge.textsafe import printable

TITLE = "\x1b]0;pwned\x07"  # sets the terminal's title (OSC 0), ended by BEL
CLEAR = "\x1b[2J"  # clears the screen (CSI)
#: every kind of character a terminal acts on: C0 (ESC, BEL, CR, BS), DEL, C1 (CSI as one
#: character), the line separator, a bidi override
HOSTILE = f"{TITLE}{CLEAR}cam\rfake\bX\x7f\x9b31m\u2028\u202eevil"
#: what a terminal obeys: any of these in output is a failure
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def raw_controls(text: str) -> list[str]:
    return RAW.findall(text)


# -- the helper ----------------------------------------------------------------------------------------
def test_printable_escapes_every_control_and_keeps_the_rest():
    shown = printable(HOSTILE + "\nnext")
    assert raw_controls(shown) == [] and "\n" not in shown
    assert shown == ("\\x1b]0;pwned\\x07\\x1b[2Jcam\\rfake\\x08X\\x7f\\x9b31m\\u2028\\u202eevil\\nnext")
    assert printable("Größe 東京 tab-free, back\\slash") == "Größe 東京 tab-free, back\\slash"


def test_printable_can_keep_newlines_but_never_a_carriage_return():
    assert printable("line 1\r\nline 2\x1b[K", keep_newlines=True) == "line 1\\r\nline 2\\x1b[K"


# -- yoloedge-ctl status -----------------------------------------------------------------------------
def hostile_status() -> dict:
    return {
        "ok": True,
        "daemon": {"state": "running", "pid": 1, "version": "0.1.0" + CLEAR, "uptime_s": 12.0,
                   "config": "/etc/yoloedge/yoloedge.yaml", "generation": 2,
                   "config_error": f"cameras[0].url: {TITLE}bad\nmqtt.port: {CLEAR}",
                   "restart_needed_for": [TITLE], "healthy": False, "problems": [f"camera {HOSTILE}: failed"]},
        "accelerators": [{"name": "ort0", "backend": "onnxruntime", "device": "cpu", "model": f"m{CLEAR}.onnx",
                          "batch": 1, "state": "running", "healthy": True, "description": HOSTILE}],
        "cameras": [{"name": HOSTILE, "url": f"http://cam/{TITLE}", "state": "backoff", "fps_in": 0.0,
                     "error": f"HTTP 200 {HOSTILE}"},
                    {"name": "plain", "url": "http://cam2/", "state": "streaming", "fps_in": 10.0, "error": None}],
        "mqtt": {"connected": True, "broker": f"broker{TITLE}:1883", "queued": 0, "delivered": 1, "dropped": 0},
    }


def test_the_status_table_shows_every_hostile_field_escaped_and_aligned():
    text = format_status(hostile_status())
    assert raw_controls(text) == [], raw_controls(text)
    assert "\\x1b]0;pwned\\x07\\x1b[2Jcam\\rfake" in text and "HTTP 200 \\x1b]0;pwned" in text
    lines = text.splitlines()
    assert "!! mqtt.port: \\x1b[2J" in lines  # a multi-line reload error stays one problem per line
    header = next(line for line in lines if line.strip().startswith("NAME") and "FPS IN" in line)
    hostile = next(line for line in lines if "\\x1b]0;pwned\\x07\\x1b[2Jcam" in line and "backoff" in line)
    plain = next(line for line in lines if line.strip().startswith("plain "))
    assert header.index("STATE") == hostile.index("backoff") == plain.index("streaming")


@pytest.fixture
def control_server():
    folder = tempfile.mkdtemp(prefix="ye-", dir="/tmp")  # AF_UNIX paths must stay short
    server = ControlServer(os.path.join(folder, "control.sock"), 0o600, lambda request: hostile_status())
    server.start()
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


def test_ctl_status_over_the_socket_prints_no_control_character(control_server):
    table = ctl(control_server.path, "status")
    assert table.returncode == 1  # degraded
    assert raw_controls(table.stdout) == [] and "\\x1b]0;pwned\\x07" in table.stdout
    as_json = ctl(control_server.path, "status", "--json")
    assert raw_controls(as_json.stdout) == []  # ensure_ascii: \u001b, \u009b, \u2028 in the JSON text
    assert json.loads(as_json.stdout)["cameras"][0]["name"] == HOSTILE  # and the data unchanged


# -- yoloedge detect -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo_frame(tmp_path_factory) -> Path:
    """A frame of the demo clip, on which the demo model finds shapes."""
    cap = cv2.VideoCapture(str(demo.clip_path()))
    ok, frame = cap.read()
    cap.release()
    assert ok
    path = tmp_path_factory.mktemp("frames") / "frame.png"
    cv2.imwrite(str(path), frame)
    return path


def run_detect(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge", "detect", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_detect_shows_hostile_labels_and_file_names_escaped(tmp_path, demo_frame):
    labels = tmp_path / "labels.txt"
    labels.write_text("".join(f"{TITLE}{CLEAR}shape{i}\r\n" for i in range(5)), encoding="utf-8")
    image = tmp_path / f"{CLEAR}frame{TITLE}.png"
    shutil.copy(demo_frame, image)
    broken = tmp_path / f"{TITLE}broken.jpg"
    broken.write_bytes(b"not an image")
    proc = run_detect("-m", demo.MODEL, "--labels", labels, image, broken)
    assert proc.returncode == 2  # one image could not be read
    assert "shape" in proc.stdout and "detection(s)" in proc.stdout, proc.stdout + proc.stderr
    for stream in (proc.stdout, proc.stderr):
        assert raw_controls(stream) == [], raw_controls(stream)
    assert "\\x1b]0;pwned\\x07\\x1b[2Jshape" in proc.stdout
    assert "\\x1b[2Jframe\\x1b]0;pwned\\x07.png" in proc.stdout
    assert "\\x1b]0;pwned\\x07broken.jpg" in proc.stderr
    as_json = run_detect("--json", "-m", demo.MODEL, "--labels", labels, image)
    assert raw_controls(as_json.stdout) == []
    assert json.loads(as_json.stdout.splitlines()[0])["detections"][0]["label"].startswith(TITLE + CLEAR)


def test_detect_shows_hostile_labels_from_model_metadata_escaped(tmp_path, demo_frame):
    model = onnx.load(str(demo.MODEL))
    names = {i: f"{TITLE}{CLEAR}meta{i}\r" for i in range(5)}
    for prop in model.metadata_props:
        if prop.key == "names":
            prop.value = repr(names)  # the Python-literal form Ultralytics writes, escapes and all
    path = tmp_path / "hostile.onnx"
    onnx.save(model, str(path))
    proc = run_detect("-m", path, demo_frame)
    assert proc.returncode == 0, proc.stderr
    assert raw_controls(proc.stdout) == [] and "\\x1b]0;pwned\\x07\\x1b[2Jmeta" in proc.stdout


# -- yoloedge check ------------------------------------------------------------------------------------
def test_check_messages_show_hostile_keys_and_file_names_escaped(tmp_path):
    config = tmp_path / f"{TITLE}yoloedge.yaml"
    config.write_text('"\\e[2J\\x9b2J\\u202e\\a": 1\ncameras: []\n', encoding="utf-8")  # raw once parsed
    proc = subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(config)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 78, proc.stdout + proc.stderr
    assert raw_controls(proc.stderr) == [], raw_controls(proc.stderr)
    assert "\\x1b]0;pwned\\x07yoloedge.yaml:1: a key must not contain control characters" in proc.stderr


# -- the log -------------------------------------------------------------------------------------------
def test_the_stderr_log_escapes_controls_but_keeps_traceback_lines():
    stream = io.StringIO()
    handler = make_handler("stderr", {}, stream=stream)
    logger = logging.getLogger("yoloedge.test_terminal_text")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError(f"bad label {TITLE}")
        except ValueError:
            logger.exception("camera %s: %s", "gate", f"HTTP 500 {CLEAR}\rOK", extra={"camera": "gate"})
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert raw_controls(text) == [], raw_controls(text)
    first, *rest = text.splitlines()
    assert first == "ERROR yoloedge.test_terminal_text: [gate] camera gate: HTTP 500 \\x1b[2J\\rOK"
    assert rest[0] == "Traceback (most recent call last):"
    assert rest[-1] == "ValueError: bad label \\x1b]0;pwned\\x07"


# -- the daemon, end to end ----------------------------------------------------------------------------
def test_a_hostile_file_name_in_a_camera_folder_reaches_ctl_and_the_log_escaped(tmp_path, demo_frame, mosquitto):
    """A folder camera whose only file is a bomb named with escape sequences: its name reaches the
    camera's error (status) and the log, both as escapes; the other camera goes on."""
    folder = tmp_path / "drop"
    folder.mkdir()
    (folder / f"{TITLE}{CLEAR}x.png").write_bytes(png_bomb(60000, 60000))
    sock = Path(tempfile.mkdtemp(prefix="ye-", dir="/tmp")) / "control.sock"
    config = {
        "device_id": "edge1",
        "model": {"path": str(demo.MODEL), "labels": str(demo.LABELS)},
        "accelerators": [{"name": "plan", "backend": "simulated", "batch": 1,
                          "simulated": {"device_ms": [1, 1], "image": str(demo_frame)}}],
        "cameras": [{"name": "drop", "url": str(folder), "backoff_initial_s": 0.5, "backoff_max_s": 1},
                    {"name": "sim", "url": "synthetic://320x240?fps=5"}],
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": "yt"},
        "control": {"socket": str(sock)},
        "shutdown_timeout_s": 10,
    }
    notify = NotifySocket(tmp_path / "notify.sock")
    daemon = Daemon(write_config(tmp_path / "yoloedge.yaml", config), notify)
    try:
        notify.wait_for("READY", "1", timeout=60)
        deadline, table = time.monotonic() + 30, None
        while time.monotonic() < deadline:
            table = ctl(str(sock), "status")
            if "over the bound" in table.stdout:
                break
            time.sleep(0.3)
        assert table is not None and "over the bound" in table.stdout, (table and table.stdout, daemon.log)
        assert raw_controls(table.stdout) == [], raw_controls(table.stdout)
        assert "\\x1b]0;pwned\\x07\\x1b[2Jx.png: 60000x60000 pixels" in table.stdout
        sim = next(line for line in table.stdout.splitlines() if line.strip().startswith("sim "))
        assert "streaming" in sim
        assert daemon.stop() == 0
        log = daemon.log
        assert "\\x1b]0;pwned\\x07\\x1b[2Jx.png: 60000x60000 pixels, over the bound" in log, log[-2000:]
        assert raw_controls(log) == [], raw_controls(log)
    finally:
        daemon.kill()
        notify.close()
        shutil.rmtree(sock.parent, ignore_errors=True)

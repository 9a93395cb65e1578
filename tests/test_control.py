"""The control socket and `yoloedge-ctl`, against a test-owned server with a canned status."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import subprocess
import sys
import time

import pytest

from conftest import REPO
from yoloedge.cli import ctl
from yoloedge.control import client
from yoloedge.control.client import ControlError, NotRunning, PermissionDenied, request
from yoloedge.control.server import ControlServer, ControlServerError


def canned_status(healthy: bool = True, config_error: str | None = None) -> dict:
    problems = [] if healthy else ["camera dock: no frame for 12.0 s"]
    restart_needed_for = [] if healthy else ["model"]
    return {
        "ok": True,
        "daemon": {"state": "running", "pid": 4242, "version": "0.1.0", "uptime_s": 7384.2,
                   "config": "/etc/yoloedge/yoloedge.yaml", "generation": 3,
                   "config_error": config_error, "restart_needed_for": restart_needed_for,
                   "healthy": healthy, "problems": problems},
        "accelerators": [{"name": "onnxruntime0", "backend": "onnxruntime", "device": "cpu",
                          "model": "yolov8n.onnx", "batch": 4, "state": "running", "healthy": True,
                          "inferences_per_s": 31.25, "p50_ms": 12.5, "p99_ms": None, "queue_depth": 1,
                          "errors": 0, "description": "CPUExecutionProvider"}],
        "cameras": [
            {"name": "gate", "url": "rtsp://***@10.0.0.5/stream", "state": "running",
             "fps_in": 10.0, "fps_out": 9.96, "drops": 3, "reconnects": 0, "stalls": 0,
             "last_frame_age_s": 0.08, "latency_p50_ms": 45.0, "latency_p99_ms": 80.5, "error": None},
            {"name": "dock", "url": "rtsp://10.0.0.6/stream", "state": "reconnecting",
             "fps_in": 0.0, "fps_out": 0.0, "drops": 0, "reconnects": 7, "stalls": 2,
             "last_frame_age_s": None, "latency_p50_ms": None, "latency_p99_ms": None,
             "error": "connection refused"},
        ],
        "mqtt": {"connected": True, "broker": "broker.local:1883", "queued": 0, "delivered": 1234,
                 "dropped": 0},
    }


class Daemon:
    """The handler side: answers like the real daemon will."""

    def __init__(self, status: dict | None = None, reload_reply: dict | None = None) -> None:
        self.status = status or canned_status()
        self.reload_reply = reload_reply or {"ok": True, "generation": 4, "reloaded": True,
                                             "config_error": None}
        self.requests: list[dict] = []

    def __call__(self, req: dict) -> dict:
        self.requests.append(req)
        if req["cmd"] == "status":
            return self.status
        if req["cmd"] == "reload":
            return self.reload_reply
        if req["cmd"] == "boom":
            raise RuntimeError("handler exploded")
        if req["cmd"] == "not-a-dict":
            return ["nope"]  # type: ignore[return-value]
        return {"ok": False, "error": f"unknown command {req['cmd']!r}"}


@pytest.fixture
def daemon():
    return Daemon()


@pytest.fixture
def server(sock_dir, daemon):
    srv = ControlServer(os.path.join(sock_dir, "run", "control.sock"), 0o660, daemon, client_timeout_s=0.5)
    srv.start()
    yield srv
    srv.stop()


def raw_exchange(path: str, data: bytes, timeout: float = 2.0) -> list[dict]:
    """Send raw bytes, read until the server closes; the replies as dicts."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return [json.loads(line) for line in received.splitlines()]


def stale_socket(path: str) -> None:
    """A socket file nobody listens on, as a crashed daemon leaves behind."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.close()


# --- server and client -----------------------------------------------------------------------


def test_round_trip(server, daemon):
    assert request(server.path, {"cmd": "status"}) == daemon.status
    assert request(server.path, {"cmd": "reload"})["generation"] == 4
    unknown = request(server.path, {"cmd": "frobnicate"})
    assert unknown == {"ok": False, "error": "unknown command 'frobnicate'"}
    assert [r["cmd"] for r in daemon.requests] == ["status", "reload", "frobnicate"]


def test_socket_file_mode_and_parent_dir(server):
    info = os.stat(server.path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o660
    assert os.path.isdir(os.path.dirname(server.path))


def test_other_mode(sock_dir, daemon):
    with ControlServer(os.path.join(sock_dir, "c.sock"), 0o600, daemon) as srv:
        assert stat.S_IMODE(os.stat(srv.path).st_mode) == 0o600


def test_start_stop_idempotent_and_unlinks(sock_dir, daemon):
    srv = ControlServer(os.path.join(sock_dir, "c.sock"), 0o660, daemon)
    srv.start()
    srv.start()
    assert request(srv.path, {"cmd": "status"})["ok"]
    srv.stop()
    srv.stop()
    assert not os.path.exists(srv.path)
    with pytest.raises(NotRunning):
        request(srv.path, {"cmd": "status"})
    srv.start()  # restartable (e.g. after a reload changed nothing)
    assert request(srv.path, {"cmd": "status"})["ok"]
    srv.stop()


def test_stale_socket_file_is_replaced(sock_dir, daemon):
    path = os.path.join(sock_dir, "c.sock")
    stale_socket(path)
    with pytest.raises(NotRunning, match="nothing accepts"):
        request(path, {"cmd": "status"})
    with ControlServer(path, 0o660, daemon):
        assert request(path, {"cmd": "status"})["ok"]


def test_live_socket_is_not_stolen(server, daemon):
    with pytest.raises(ControlServerError, match="in use") as raised:
        ControlServer(server.path, 0o660, daemon).start()
    assert isinstance(raised.value, OSError)  # the daemon treats it like any socket failure
    assert request(server.path, {"cmd": "status"})["ok"]


def test_non_socket_file_is_not_removed(sock_dir, daemon):
    path = os.path.join(sock_dir, "c.sock")
    with open(path, "w") as fh:
        fh.write("precious")
    with pytest.raises(ControlServerError, match="not a socket"):
        ControlServer(path, 0o660, daemon).start()
    assert open(path).read() == "precious"


def test_malformed_requests(server):
    replies = raw_exchange(server.path, b'not json\n[1, 2]\n{"command": "status"}\n\n{"cmd": "status"}\n')
    assert [r["ok"] for r in replies] == [False, False, False, True]
    assert all("malformed request" in r["error"] for r in replies[:3])


def test_handler_exception_is_reported_and_logged(server, caplog):
    with caplog.at_level(logging.ERROR, logger="yoloedge.control.server"):
        reply = request(server.path, {"cmd": "boom"})
        bad = request(server.path, {"cmd": "not-a-dict"})
    assert reply["ok"] is False and "handler exploded" in reply["error"]
    assert bad["ok"] is False and "not a dict" in bad["error"]
    assert any("boom" in r.getMessage() and r.exc_info for r in caplog.records)
    assert request(server.path, {"cmd": "status"})["ok"]  # still serving


def test_silent_client_is_disconnected(server):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        sock.connect(server.path)
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server hung up on us
        assert time.monotonic() - started < 4.0
    assert request(server.path, {"cmd": "status"})["ok"]


def test_client_not_running(sock_dir):
    with pytest.raises(NotRunning, match="not running"):
        request(os.path.join(sock_dir, "absent.sock"), {"cmd": "status"})


def test_client_no_answer(sock_dir):
    path = os.path.join(sock_dir, "mute.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as mute:
        mute.bind(path)
        mute.listen(1)
        with pytest.raises(ControlError, match="did not answer"):
            request(path, {"cmd": "status"}, timeout=0.2)


class _DeniedSocket:
    """Stands in for socket.socket where connect() meets EACCES (hard to provoke as root)."""

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def settimeout(self, timeout):
        pass

    def connect(self, path):
        raise PermissionError(13, "Permission denied", path)


def test_client_permission_denied_mapping(monkeypatch, capsys):
    monkeypatch.setattr(client.socket, "socket", _DeniedSocket)
    with pytest.raises(PermissionDenied, match="'yoloedge' group or use sudo"):
        request("/run/yoloedge/control.sock", {"cmd": "status"})
    assert ctl.main(["--socket", "/run/yoloedge/control.sock", "status"]) == 4
    err = capsys.readouterr().err
    assert "not permitted: add your user to the 'yoloedge' group or use sudo" in err


# --- yoloedge-ctl as a user runs it ----------------------------------------------------------


def run_ctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge.cli.ctl", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=30)


def test_ctl_status_table(server):
    proc = run_ctl("--socket", server.path, "status")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0] == "yoloedge 0.1.0: running (pid 4242), up 2h 03m, healthy"
    assert "/etc/yoloedge/yoloedge.yaml (generation 3)" in out
    lines = out.splitlines()
    gate = next(line for line in lines if line.strip().startswith("gate "))
    dock = next(line for line in lines if line.strip().startswith("dock "))
    assert "rtsp://***@10.0.0.5/stream" in gate and "10.0" in gate
    assert "reconnecting" in dock and "connection refused" in dock and " - " in dock
    header = next(line for line in lines if line.strip().startswith("NAME") and "FPS IN" in line)
    assert header.index("STATE") == gate.index("running") == dock.index("reconnecting")  # aligned
    assert any(line.strip().startswith("onnxruntime0 ") and "yolov8n.onnx" in line for line in lines)
    assert "mqtt: connected to broker.local:1883; queued 0, delivered 1234, dropped 0" in out
    assert "problems: none" in out


def test_ctl_status_json(server, daemon):
    proc = run_ctl("--socket", server.path, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == daemon.status


DEGRADED = Daemon(canned_status(healthy=False, config_error="cameras[2].url: missing"))


@pytest.mark.parametrize("daemon", [DEGRADED])
def test_ctl_status_degraded(server):
    proc = run_ctl("--socket", server.path, "status")
    assert proc.returncode == 1, proc.stderr
    assert "DEGRADED" in proc.stdout.splitlines()[0]
    assert "!! LAST RELOAD REJECTED" in proc.stdout
    assert "cameras[2].url: missing" in proc.stdout
    assert "restart needed to apply changes to: model" in proc.stdout
    assert "  - camera dock: no frame for 12.0 s" in proc.stdout
    assert run_ctl("--socket", server.path, "status", "--json").returncode == 1


def test_ctl_not_running(sock_dir):
    proc = run_ctl("--socket", os.path.join(sock_dir, "absent.sock"), "status")
    assert proc.returncode == 3
    assert "yoloedge is not running" in proc.stderr
    stale = os.path.join(sock_dir, "stale.sock")
    stale_socket(stale)
    proc = run_ctl("--socket", stale, "status")
    assert proc.returncode == 3
    assert "yoloedge is not running" in proc.stderr


def test_ctl_config_file(server, sock_dir):
    config = os.path.join(sock_dir, "yoloedge.yaml")
    with open(config, "w") as fh:
        fh.write(f"device_id: test\ncontrol:\n  socket: {server.path}\ncameras: []\n")
    proc = run_ctl("-c", config, "status")
    assert proc.returncode == 0, proc.stderr
    assert "gate" in proc.stdout


def test_ctl_config_file_problems(sock_dir, tmp_path):
    missing = run_ctl("-c", str(tmp_path / "nope.yaml"), "status")
    assert missing.returncode == 2 and "cannot read config file" in missing.stderr
    broken = tmp_path / "broken.yaml"
    broken.write_text("control: [unclosed\n")
    proc = run_ctl("-c", str(broken), "status")
    assert proc.returncode == 2 and "not valid YAML" in proc.stderr


def test_socket_from_config_defaults(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert ctl.socket_from_config(str(empty)) == "/run/yoloedge/control.sock"
    other = tmp_path / "other.yaml"
    other.write_text("device_id: x\n")
    assert ctl.socket_from_config(str(other)) == "/run/yoloedge/control.sock"
    bad = tmp_path / "bad.yaml"
    bad.write_text("control:\n  socket: 5\n")
    with pytest.raises(ctl.ConfigFileError):
        ctl.socket_from_config(str(bad))


def test_ctl_socket_and_config_are_exclusive(sock_dir):
    proc = run_ctl("--socket", "/x", "-c", "/y", "status")
    assert proc.returncode == 2


def test_ctl_reload(server, daemon):
    proc = run_ctl("--socket", server.path, "reload")
    assert proc.returncode == 0, proc.stderr
    assert "reloaded (generation 4)" in proc.stdout
    assert daemon.requests[-1] == {"cmd": "reload"}


@pytest.mark.parametrize("daemon", [Daemon(reload_reply={"ok": False, "generation": 3, "reloaded": False,
                                                          "config_error": "mqtt.port: not an integer"})])
def test_ctl_reload_rejected(server):
    proc = run_ctl("--socket", server.path, "reload")
    assert proc.returncode == 1
    assert "reload rejected, still running generation 3:\nmqtt.port: not an integer" in proc.stderr


def test_ctl_permission_denied_as_unprivileged_user(sock_dir, daemon, nobody_python):
    private = os.path.join(sock_dir, "private")
    os.mkdir(private, 0o700)  # root-owned: no search permission for uid 65534
    with ControlServer(os.path.join(private, "control.sock"), 0o660, daemon) as srv:
        proc = subprocess.run(nobody_python.argv("-m", "yoloedge.cli.ctl", "--socket", srv.path, "status"),
                              cwd=nobody_python.home, env=nobody_python.env(), capture_output=True, text=True,
                              timeout=30)
    assert proc.returncode == 4, proc.stderr
    assert "not permitted: add your user to the 'yoloedge' group or use sudo" in proc.stderr


def test_ctl_status_says_when_the_broker_stops_acknowledging():
    status = canned_status(healthy=False)
    status["mqtt"]["ack_stalled"] = True
    line = next(line for line in ctl.format_status(status).splitlines() if line.startswith("mqtt:"))
    assert line.startswith("mqtt: connected (NOT ACKNOWLEDGING) to broker.local:1883;"), line
    status["mqtt"]["connected"] = False  # disconnected wins: nothing can be acknowledged then
    line = next(line for line in ctl.format_status(status).splitlines() if line.startswith("mqtt:"))
    assert line.startswith("mqtt: DISCONNECTED from broker.local:1883;"), line


def test_ctl_status_says_when_the_connection_keeps_being_taken_away():
    status = canned_status(healthy=False)
    status["mqtt"]["unstable"] = True
    line = next(line for line in ctl.format_status(status).splitlines() if line.startswith("mqtt:"))
    assert line.startswith("mqtt: connected (UNSTABLE) to broker.local:1883;"), line


def test_the_status_text_shows_each_cameras_zones_and_lines_by_label():
    from yoloedge.control.statustext import format_status

    status = {"daemon": {"state": "running"}, "cameras": [
        {"name": "gate", "state": "streaming",
         "zones": [{"name": "yard", "polygon": [[0, 0], [1, 0], [1, 1]], "objects": {"person": 2, "car": 0},
                    "entered": {"person": 5, "car": 1}}],
         "lines": [{"name": "drive", "points": [[0.5, 0], [0.5, 1]], "in": {"car": 3}, "out": {"car": 0}}]},
        {"name": "door", "state": "streaming"}]}
    text = format_status(status).splitlines()
    start = text.index("zones and lines:")
    rows = [line.split() for line in text[start + 2:start + 4]]
    assert rows[0] == ["gate", "zone", "yard", "inside", "person", "2", "entered", "car", "1,", "person", "5"]
    assert rows[1] == ["gate", "line", "drive", "in", "car", "3", "out", "-"]
    assert "zones and lines:" not in format_status({"daemon": {}, "cameras": [{"name": "door"}]})

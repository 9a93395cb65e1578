"""Reading events back: `GET /api/events`, `GET /api/events/{id}/snapshot.jpg`, `yoloedge-ctl
events` and `yoloedge-ctl watch --events`, against the daemon's own endpoint and control handler
(a `Daemon` built but not run: its HTTP endpoint, `_handle_control`, event log and watch hub) on
real sockets. The router feeds the log in the daemon; here the test feeds it, as the router will."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

import cv2
import numpy as np
import pytest

from conftest import REPO
from test_http_access import raw, status_of
from yoloedge.config.model import ModelConfig
from yoloedge.config.schema import CameraConfig, Config, ControlConfig, HttpConfig
from yoloedge.control.client import request
from yoloedge.control.server import ControlServer
from yoloedge.daemon import Daemon

SECRET = "events-pass-9Zq"
#: an id with characters a URL must escape (the events module makes plainer ones)
ODD_ID = "lq3x2a-17:caf\u00e9"


def event(event_id: str, camera: str, kind: str = "new", **extra) -> dict:
    return {"v": 1, "type": kind, "id": event_id, "camera": camera, "label": "person", "start_time": 1_700_000_000.0,
            "end_time": None, "frame_time": 1_700_000_004.5, "score": 0.81, "top_score": 0.9,
            "box": [20, 16, 100, 80], "current_zones": ["yard"], "entered_zones": ["yard"],
            "crossings": [{"line": "gate", "direction": "in", "time": 1_700_000_003.0}], **extra}


@pytest.fixture
def daemon(sock_dir):
    """A daemon as `yoloedge run` builds it, with cameras gate and dock known and a few events
    recorded (gate's first with a best shot), its endpoint listening on a free port with basic
    auth, and its control handler and watch streams served on a socket; nothing else runs."""
    config = Config(device_id="edge", model=ModelConfig(path="model.onnx"), accelerators=(),
                    control=ControlConfig(socket=str(sock_dir / "control.sock")))
    built = Daemon(config, "yoloedge.yaml", {})
    for name in ("gate", "dock"):
        built.snapshots.add(name)
        built.events.configure_camera(CameraConfig(name=name, url="rtsp://h/s"))
    built.events.record(event(ODD_ID, "gate"))
    built.events.best_shot("gate", ODD_ID, np.full((120, 160, 3), 90, np.uint8), (20, 16, 100, 80), 0.9,
                           1_700_000_002.0)
    built.events.record(event("b-2", "dock"))
    built.events.record(event(ODD_ID, "gate", kind="update", score=0.7))
    built.http.start(HttpConfig(listen=("127.0.0.1", 0), username="prom", password=SECRET))
    control = ControlServer(config.control.socket, 0o600, built._handle_control,
                            streams={"watch": built.watchers.opener(built.snapshots.known)})
    control.start()
    yield built
    control.stop()
    built.http.stop()


def get(built: Daemon, path: str, auth: str | None = SECRET, method: str = "GET", host: str = "127.0.0.1"):
    """(status, head, body) of one request to the daemon's endpoint."""
    assert built.http.server is not None
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    if auth is not None:
        lines.append("Authorization: Basic " + base64.b64encode(f"prom:{auth}".encode()).decode())
    reply = raw(built.http.server.address[1], ("\r\n".join(lines) + "\r\n\r\n").encode())
    head, _, body = reply.partition(b"\r\n\r\n")
    return status_of(reply), head.decode("latin-1"), body


def test_api_events_lists_the_recent_events_as_json(daemon):
    code, head, body = get(daemon, "/api/events")
    assert code == 200 and "Content-Type: application/json" in head
    reply = json.loads(body)
    assert reply["ok"] is True and reply["camera"] is None
    assert [(e["id"], e["type"]) for e in reply["events"]] == [("b-2", "new"), (ODD_ID, "update")]
    gate = reply["events"][1]
    assert gate["score"] == 0.7 and gate["crossings"][0] == {"line": "gate", "direction": "in",
                                                                "time": 1_700_000_003.0}
    jpeg = gate["jpeg"]
    assert jpeg["frame_time"] == 1_700_000_002.0 and jpeg["score"] == 0.9 and jpeg["box"] == [20, 16, 100, 80]
    assert reply["events"][0]["jpeg"] is None, "dock's event has no shot"
    assert reply == request(daemon.config.control.socket, {"cmd": "events"}), "HTTP and ctl answer alike"

    assert [e["id"] for e in json.loads(get(daemon, "/api/events?camera=gate")[2])["events"]] == [ODD_ID]
    assert [e["id"] for e in json.loads(get(daemon, "/api/events?limit=1")[2])["events"]] == ["b-2"]
    assert get(daemon, "/api/events?camera=nowhere")[0] == 404
    for query in ("limit=0", "limit=x", "limit=1001", "camera=gate&camera=dock", "since=5", "camera",
                  "a=1&b=2&c=3", "camera=%ff"):
        assert get(daemon, f"/api/events?{query}")[0] == 400, query


def test_an_events_snapshot_is_its_jpeg_and_anything_else_is_refused(daemon):
    path = f"/api/events/{urllib.parse.quote(ODD_ID, safe='')}/snapshot.jpg"
    code, head, body = get(daemon, path)
    assert code == 200 and "Content-Type: image/jpeg" in head
    assert body == daemon.events.snapshot(ODD_ID)
    assert cv2.imdecode(np.frombuffer(body, np.uint8), cv2.IMREAD_COLOR).shape == (120, 160, 3)
    code, head, body = get(daemon, path, method="HEAD")
    assert code == 200 and body == b"" and f"Content-Length: {len(daemon.events.snapshot(ODD_ID))}" in head
    assert get(daemon, "/api/events/b-2/snapshot.jpg")[0] == 404, "an event without a shot"
    assert get(daemon, "/api/events/nope-1/snapshot.jpg")[0] == 404
    for bad in ("%2e%2e", ".", "..%2f..%2fetc", "a%2Fb", "a%5cb", "%ff", "a%20b", "a%00", "x" * 300, ""):
        assert get(daemon, f"/api/events/{bad}/snapshot.jpg")[0] == 400, bad
    for other in ("/api/events/b-2", "/api/events/b-2/snapshot.png", "/api/events/", "/api/events/../status"):
        assert get(daemon, other)[0] in (400, 404), other


def test_the_events_endpoints_ask_for_the_password_and_the_host_like_the_others(daemon):
    quoted = urllib.parse.quote(ODD_ID, safe="")
    for path in ("/api/events", f"/api/events/{quoted}/snapshot.jpg"):
        code, head, body = get(daemon, path, auth=None)
        assert code == 401 and "WWW-Authenticate" in head and b"person" not in body
        assert get(daemon, path, host="rebind.example")[0] == 421
    code, _, body = get(daemon, "/api/events", auth="wrong")
    assert code == 401 and b"person" not in body


def run_ctl(sock: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge.cli.ctl", "--socket", sock, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=30)


def test_ctl_events_prints_a_table_or_the_json(daemon):
    sock = daemon.config.control.socket
    proc = run_ctl(sock, "events")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["STARTED", "(UTC)", "CAMERA", "EVENT", "LABEL", "STATE", "FOR", "TOP", "IN", "NOW",
                                "ENTERED", "CROSSINGS", "SNAPSHOT"]
    dock, gate = lines[1], lines[2]
    assert dock.startswith("2023-11-14 22:13:20  dock") and "b-2" in dock and dock.rstrip().endswith("-")
    assert ODD_ID in gate and "active" in gate and "4s" in gate and "0.90" in gate and "gate in" in gate
    assert gate.rstrip().endswith(f"{len(daemon.events.snapshot(ODD_ID)) / 1000:.0f} kB")
    assert lines[0].index("STATE") == gate.index("active"), "columns aligned"

    proc = run_ctl(sock, "events", "dock", "--json", "--limit", "5")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"ok": True, "camera": "dock", "events": daemon.events.recent("dock")}

    proc = run_ctl(sock, "events", "nowhere")
    assert proc.returncode == 5 and "nowhere" in proc.stderr
    refused = run_ctl(sock, "events", "--limit", "0")
    assert refused.returncode == 2 and "from 1 to 1000" in refused.stderr
    daemon.events.forget_camera("dock")
    assert run_ctl(sock, "events", "dock").stdout == "no events of camera dock yet\n"


def test_the_control_events_command_refuses_what_it_does_not_take(daemon):
    sock = daemon.config.control.socket
    assert "does not take" in request(sock, {"cmd": "events", "since": 5})["error"]
    assert request(sock, {"cmd": "events", "camera": 3})["reason"] == "bad_request"


class Lines:
    """A subprocess's stdout lines, read on a thread."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(line.rstrip("\n") for line in proc.stdout),
                                        daemon=True)
        self._thread.start()

    def wait(self, count: int, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.lines) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.lines)


def wait_for_watchers(built: Daemon, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(built.watchers.stats()) < count:
        assert time.monotonic() < deadline, "the watchers never subscribed"
        time.sleep(0.05)


def test_ctl_watch_events_streams_the_event_messages_only(daemon):
    sock = daemon.config.control.socket
    command = [sys.executable, "-m", "yoloedge.cli.ctl", "--socket", sock, "watch"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    procs = [subprocess.Popen([*command, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
             for args in (["gate", "--events", "--json"], ["--events"])]
    try:
        raw_lines, human = Lines(procs[0]), Lines(procs[1])
        wait_for_watchers(daemon, 2)
        assert sorted((w["camera"] or "", w["channel"]) for w in daemon.watchers.stats()) == \
               [("", "events"), ("gate", "events")]
        sent = [event("w-1", "gate"), event("w-2", "dock"), event("w-1", "gate", kind="end", end_time=1_700_000_009.0)]
        for message in sent:
            daemon.watchers.publish("gate", {"camera": "gate", "frame": 1, "detections": []})  # not for them
            daemon.watchers.publish_event(message["camera"], message)
        assert [json.loads(line) for line in raw_lines.wait(2)] == [sent[0], sent[2]], "gate's events, as sent"
        shown = human.wait(3)
        assert len(shown) == 3 and shown[0].startswith("22:13:24.500 [gate] new w-1 person 0.81; in yard; gate in")
        assert "[dock] new w-2" in shown[1] and "[gate] end w-1" in shown[2]
        assert len(raw_lines.wait(3, timeout=0.5)) == 2, "a detection message reached an events watcher"
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
            proc.stdout.close()
            proc.stderr.close()
    unknown = subprocess.run([*command, "nowhere", "--events"], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert unknown.returncode == 5 and "nowhere" in unknown.stderr


def test_the_daemons_status_counts_the_events_and_shots_kept(daemon):
    kept = daemon.status()["events"]
    assert kept["cameras"]["gate"] == {"events": 1, "snapshots": 1, "budget_bytes": 16 * 1024 * 1024,
                                       "snapshot_bytes": len(daemon.events.snapshot(ODD_ID))}
    assert kept["cameras"]["dock"]["snapshots"] == 0 and kept["encoded"] == 1

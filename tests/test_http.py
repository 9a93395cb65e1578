"""The daemon's HTTP endpoint: `/metrics` (Prometheus), `/api/status`, its config, auth, limits
and reload. Real parts: the daemon as a subprocess, mosquitto, the shared model and video, and
real sockets for every client (hostile ones included)."""

from __future__ import annotations

import base64
import json
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from http import HTTPStatus
from pathlib import Path

import pytest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from daemon_harness import REPO, status, write_config
from fixtures_media import free_port
import test_daemon
from yoloedge.config.errors import ConfigError
from yoloedge.config.loader import load_config
from yoloedge.config.schema import HttpConfig
from yoloedge.metrics import BucketCounts
from yoloedge.web.metrics import add_histogram
from yoloedge.web.server import MAX_CONNECTIONS, MAX_HEAD_BYTES, HttpServer, Response, Router, text_response

PREFIX = "yh"
DEVICE = "edge1"
PASSWORD = "s3cret-http-pass"
#: status fields that move by themselves between two reads (clocks and rates)
TIMING = {"uptime_s", "last_frame_age_s", "fps_in", "fps_out", "frames_per_s", "inferences_per_s",
          "utilisation", "busy_s", "next_retry_in_s", "telemetry"}

notify, start_daemon = test_daemon.notify, test_daemon.start_daemon  # the daemon tests' fixtures


# -- helpers -------------------------------------------------------------------------------------

def base_config(tmp_path: Path, models: Path, broker, cameras: list[dict], http: dict | None) -> dict:
    return {
        "device_id": DEVICE,
        "model": {"path": str(models / "yolov8n_coco_int8.onnx")},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 2}],
        "cameras": cameras,
        # no stats messages between two reads: the MQTT counters in status stay still
        "mqtt": {"host": broker.host if broker else "localhost", "port": broker.port if broker else 1883,
                 "topic_prefix": PREFIX, "stats_interval_s": 3600, "reconnect_min_s": 0.5, "reconnect_max_s": 2},
        "health": {"stall_timeout_s": 3, "status_interval_s": 1},
        "control": {"socket": str(tmp_path / "run" / "control.sock")},
        "http": http,
        "shutdown_timeout_s": 10,
    }



def get(port: int, path: str, auth: tuple[str, str] | None = None, timeout: float = 10.0,
        host: str | None = None) -> tuple[int, dict, bytes]:
    """`host`: the Host header, as a page whose name was rebound to 127.0.0.1 would send it."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if host is not None:
        request.add_header("Host", host)
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def scrape(port: int, **kwargs) -> dict[str, list]:
    """name -> samples (each with .name, .labels, .value), as a Prometheus server parses them."""
    code, headers, body = get(port, "/metrics", **kwargs)
    assert code == 200 and headers["Content-Type"].startswith("text/plain"), (code, body[:200])
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float:
    found = [s.value for s in samples[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, samples.get(name))
    return found[0]


def without_timing(node):
    if isinstance(node, dict):
        return {k: without_timing(v) for k, v in node.items() if k not in TIMING}
    if isinstance(node, list):
        return [without_timing(v) for v in node]
    return node


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on, from /proc (its socket inodes in LISTEN state)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


# -- config --------------------------------------------------------------------------------------

def load_http(tmp_path: Path, section: str) -> HttpConfig:
    (tmp_path / "m.onnx").write_bytes(b"onnx")
    path = tmp_path / "c.yaml"
    path.write_text(f"device_id: e\nmodel:\n  path: m.onnx\n{section}")
    return load_config(str(path), {"HTTP_PASSWORD": PASSWORD}).http


def test_http_defaults_to_loopback_and_null_turns_it_off(tmp_path):
    assert load_http(tmp_path, "") == HttpConfig(listen=("127.0.0.1", 8480))
    assert load_http(tmp_path, "http: null\n").listen is None
    assert load_http(tmp_path, "http:\n  listen: null\n").listen is None
    assert load_http(tmp_path, "http:\n  listen: '[::1]:9000'\n").listen == ("::1", 9000)
    remote = load_http(tmp_path, "http:\n  listen: 0.0.0.0:9100\n  allow_remote: true\n  username: prom\n"
                                 "  password: ${HTTP_PASSWORD}\n")
    assert (remote.listen, remote.username, remote.password) == (("0.0.0.0", 9100), "prom", PASSWORD)
    assert PASSWORD not in repr(remote)


@pytest.mark.parametrize("section, line, key, words", [
    ("http:\n  listen: 127.0.0.1:70000\n", 5, "http.listen", "port from 1 to 65535"),
    ("http:\n  listen: 127.0.0.1\n", 5, "http.listen", "HOST:PORT"),
    ("http:\n  listen: 8480\n", 5, "http.listen", "HOST:PORT"),
    ("http:\n  listen: metrics.lan:8480\n", 5, "http.listen", "IP address"),
    ("http:\n  listen: '::1:8480'\n", 5, "http.listen", "'[::1]:8480'"),
    ("http:\n  listen: 0.0.0.0:8480\n", 5, "http.listen", "allow_remote: true"),
    ("http:\n  listen: 192.0.2.7:8480\n  username: prom\n  password: x\n", 5, "http.listen", "allow_remote"),
    ("http:\n  password: ${HTTP_PASSWORD}\n", 5, "http.password", "needs a username"),
    ("http:\n  username: prom\n", 5, "http.username", "needs a password"),
    ("http:\n  allow_remote: yes please\n", 5, "http.allow_remote", "true or false"),
    ("http:\n  listn: 127.0.0.1:8480\n", 5, "http.listn", "listen"),
])
def test_bad_http_settings_name_file_line_key_and_fix(tmp_path, section, line, key, words):
    with pytest.raises(ConfigError) as caught:
        load_http(tmp_path, section)
    text = str(caught.value)
    assert f"c.yaml:{line}:" in text and key in text and words in text, text
    assert PASSWORD not in text


def test_a_bad_http_listen_exits_78_with_its_line(tmp_path, models, notify, start_daemon):
    config = base_config(tmp_path, models, None, [], {"listen": "0.0.0.0:8480"})
    daemon, path = start_daemon(config)
    assert daemon.proc.wait(30) == 78
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "0.0.0.0:8480" in text)
    assert f"yoloedge.yaml:{line}: http.listen" in daemon.log and "allow_remote: true" in daemon.log, daemon.log
    assert notify.messages == []


# -- histograms ----------------------------------------------------------------------------------

def test_bucket_counts_export_as_cumulative_prometheus_buckets():
    """A value equal to a bound counts in that bound's bucket (Prometheus' `le`), and the
    exported buckets are cumulative, ending with +Inf = the number of observations."""
    counts = BucketCounts((0.5, 1.0, 2.0))
    for v in (0.1, 0.5, 0.7, 1.0, 2.0, 9.0):
        counts.add(v)
    assert counts.snapshot() == ([2, 2, 1, 1], pytest.approx(13.3))
    family = HistogramMetricFamily("h", "test", labels=("camera",))
    add_histogram(family, ("c",), counts)
    exported = {s.name + s.labels.get("le", ""): s.value for s in family.samples}
    assert exported == {"h_bucket0.5": 2, "h_bucket1.0": 4, "h_bucket2.0": 5, "h_bucket+Inf": 6,
                        "h_count": 6, "h_sum": pytest.approx(13.3)}
    with pytest.raises(ValueError):
        BucketCounts((1.0, 0.5))


# -- the server on its own -----------------------------------------------------------------------

@pytest.fixture()
def echo_server():
    router = Router()
    router.add("/hello", lambda request: text_response(HTTPStatus.OK, "hello " + request.method))
    server = HttpServer("127.0.0.1", 0, router, timeout_s=1.0)
    server.start()
    yield server
    server.stop()


def raw(port: int, data: bytes, timeout: float = 5.0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_the_server_refuses_what_it_does_not_serve(echo_server):
    port = echo_server.address[1]
    assert raw(port, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").endswith(b"\r\n\r\nhello GET\n")
    head = raw(port, b"HEAD /hello HTTP/1.1\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
    assert raw(port, b"GET /nothing HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404 ")
    post = raw(port, b"POST /hello HTTP/1.1\r\nContent-Length: 2\r\n\r\nab")
    assert post.startswith(b"HTTP/1.1 405 ") and b"Allow: GET, HEAD" in post
    assert raw(port, b"garbage\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert raw(port, b"GET /hello HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES).startswith(b"HTTP/1.1 431 ")
    many = b"".join(b"X%d: 1\r\n" % i for i in range(100))
    assert raw(port, b"GET /hello HTTP/1.1\r\n" + many + b"\r\n").startswith(b"HTTP/1.1 431 ")
    # A client that sends half a request is closed when its time is up (1 s here), unanswered.
    t0 = time.monotonic()
    assert raw(port, b"GET /hello HTTP/1.1\r\n") == b""
    assert time.monotonic() - t0 < 4.5


def test_more_silent_clients_than_connection_slots_do_not_lock_a_scraper_out(echo_server):
    port = echo_server.address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(MAX_CONNECTIONS + 20)]
    try:
        assert raw(port, b"GET /hello HTTP/1.1\r\n\r\n").endswith(b"hello GET\n")
        # the oldest silent ones made room: the server closed them
        idle[0].settimeout(5)
        assert idle[0].recv(1) == b""
    finally:
        for sock in idle:
            sock.close()


def test_a_handler_that_raises_gets_a_500_and_the_server_serves_on():
    def broken(request):
        raise RuntimeError("boom")

    router = Router()
    router.add("/broken", broken)
    router.add("/ok", lambda request: Response(HTTPStatus.OK, b"fine"))
    server = HttpServer("127.0.0.1", 0, router)
    server.start()
    try:
        port = server.address[1]
        assert raw(port, b"GET /broken HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 500 ")
        assert raw(port, b"GET /ok HTTP/1.1\r\n\r\n").endswith(b"fine")
    finally:
        server.stop()


# -- the daemon ----------------------------------------------------------------------------------

def test_metrics_and_api_status_agree_with_ctl_and_mqtt(tmp_path, models, media, mosquitto, subscriber_factory,
                                                        notify, start_daemon):
    port = free_port()
    sub = subscriber_factory(mosquitto, (f"{PREFIX}/#",))
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(media / "indoor_people_480p_mpeg4.avi"), "realtime": False},
        {"name": "off", "url": "rtsp://192.0.2.1/none", "enabled": False},
    ], {"listen": f"127.0.0.1:{port}"})
    daemon, _ = start_daemon(config)
    notify.wait_for("READY", "1", timeout=60)
    sock = config["control"]["socket"]
    assert sub.wait_for(lambda ms: len(ms) >= 84, 120, topic=f"{PREFIX}/{DEVICE}/cameras/door/detections"), \
        daemon.log[-3000:]

    # `door` has ended, so its counts are final once status shows the last frame counted (the
    # count follows the hand-over to MQTT).
    deadline = time.monotonic() + 10
    while True:
        st = status(sock)
        door = next(c for c in st["cameras"] if c["name"] == "door")
        if door["published"] == 84 and door["state"] == "ended" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    metrics = scrape(port)
    cams = {c["name"]: c for c in st["cameras"]}
    door = cams["door"]
    assert door["state"] == "ended" and door["published"] == 84
    for name, key in (("yoloedge_camera_frames_in_total", "frames_in"),
                      ("yoloedge_camera_frames_published_total", "published"),
                      ("yoloedge_camera_frames_dropped_total", "drops"),
                      ("yoloedge_camera_reconnects_total", "reconnects")):
        assert value(metrics, name, camera="door", accelerator="onnxruntime0") == door[key], name
        assert value(metrics, name, camera="off", accelerator="onnxruntime0") == 0, name
    assert value(metrics, "yoloedge_camera_frames_in_total", camera="door") == 84
    assert value(metrics, "yoloedge_camera_up", camera="door") == 0
    assert value(metrics, "yoloedge_camera_up", camera="off") == 0

    # Detections per label: what MQTT received for the camera.
    received: dict[str, int] = {}
    for payload in sub.payloads(f"{PREFIX}/{DEVICE}/cameras/door/detections"):
        for det in payload["detections"]:
            received[det["label"]] = received.get(det["label"], 0) + 1
    assert received.get("person", 0) > 0
    exported = {s.labels["label"]: s.value for s in metrics["yoloedge_detections_total"]
                if s.labels["camera"] == "door"}
    assert exported == received

    # Latency histogram: one observation per published frame, cumulative buckets.
    buckets = [s for s in metrics["yoloedge_frame_latency_seconds_bucket"] if s.labels["camera"] == "door"]
    assert [b.value for b in buckets] == sorted(b.value for b in buckets)
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == 84
    assert value(metrics, "yoloedge_frame_latency_seconds_count", camera="door") == 84
    assert 0 < value(metrics, "yoloedge_frame_latency_seconds_sum", camera="door") < 84 * 60

    # Per device: inference time and batch size histograms, up.
    device = {"accelerator": "onnxruntime0", "device": "0"}
    assert value(metrics, "yoloedge_device_up", **device) == 1
    batches = value(metrics, "yoloedge_inference_seconds_count", **device)
    assert batches == value(metrics, "yoloedge_batch_size_count", **device) >= 42  # 84 frames, batch 2
    frames = value(metrics, "yoloedge_batch_size_sum", **device)
    assert frames >= 84 and batches <= frames <= 2 * batches
    sizes = {s.labels["le"]: s.value for s in metrics["yoloedge_batch_size_bucket"]}
    assert set(sizes) == {"1.0", "2.0", "+Inf"} and sizes["2.0"] == sizes["+Inf"] == batches

    # MQTT and the process.
    assert value(metrics, "yoloedge_mqtt_connected") == 1
    assert value(metrics, "yoloedge_mqtt_dropped_total") == st["mqtt"]["dropped"] == 0
    assert value(metrics, "yoloedge_mqtt_queued_messages") >= 0
    assert value(metrics, "process_cpu_seconds_total") > 0 and value(metrics, "process_open_fds") > 0
    # The documented dashboard asks only for what is exported.
    dashboard = (REPO / "docs" / "grafana-dashboard.json").read_text()
    assert set(re.findall(r"\b(?:yoloedge|process)_[a-z_]+", dashboard)) <= set(metrics)

    # /api/status is what `yoloedge-ctl status --json` prints.
    # The two requests are made one after the other while the daemon still publishes (stats, the
    # events' last updates), so a counter may move between them: compare pairs until one is taken
    # with nothing in between.
    for _ in range(5):
        code, headers, body = get(port, "/api/status")
        assert code == 200 and headers["Content-Type"] == "application/json"
        api = json.loads(body)
        ctl_json = status(sock)
        if without_timing(api) == without_timing(ctl_json):
            break
    assert without_timing(api) == without_timing(ctl_json)
    # Both listeners in status, with their accept() counts.
    assert api["http"] == {"listen": f"127.0.0.1:{port}", "accept_failures": 0, "refused": 0,
                           "last_accept_failure": None, "accept_failing": False, "accept_error": None}
    assert api["control"]["socket"] == sock and api["control"]["accept_failures"] == 0

    # A page whose name was rebound to 127.0.0.1 gets nothing of the daemon's.
    for path in ("/api/status", "/api/cameras/door/latest.jpg", "/", "/metrics"):
        code, _, body = get(port, path, host=f"rebind.example:{port}")
        assert code == 421 and b"door" not in body, (path, code, body[:200])
    assert get(port, "/api/cameras/door/latest.jpg", host=f"localhost:{port}")[0] == 200
    assert daemon.stop() == 0, daemon.log[-3000:]
    assert refused(port), "the endpoint is closed by the staged shutdown"


def test_auth_limits_reload_and_off(tmp_path, models, media, mosquitto, subscriber_factory, notify,
                                    start_daemon):
    """One daemon through its endpoint's life: off at start, then (by reload) a remote listener
    with basic auth, hostile clients that must delay neither a scrape nor the pipeline, a move to
    another port, a move to a port that is taken (rejected), and off again."""
    port, port2 = free_port(), free_port()
    sub = subscriber_factory(mosquitto, (f"{PREFIX}/#",))
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "cam", "url": str(media / "indoor_people_480p_mpeg4.avi"), "loop": True, "fps": 4},
    ], None)
    daemon, path = start_daemon(config, env={"YOLOEDGE_HTTP_PASSWORD": PASSWORD})
    notify.wait_for("READY", "1", timeout=60)
    sock = config["control"]["socket"]
    assert listening_ports(daemon.proc.pid) == set(), "http: null -> no listener"

    # Remote listener, basic auth.
    config["http"] = {"listen": f"0.0.0.0:{port}", "allow_remote": True, "username": "prom",
                      "password": "${YOLOEDGE_HTTP_PASSWORD}", "allowed_hosts": ["scraper.example"]}
    write_config(path, config)
    daemon.signal(signal.SIGHUP)
    notify.wait_for("READY", "1", timeout=30, count=2)
    assert status(sock)["daemon"]["config_error"] is None, daemon.log[-3000:]
    code, headers, _ = get(port, "/metrics")
    assert code == 401 and headers["WWW-Authenticate"].startswith("Basic realm=")
    assert get(port, "/metrics", auth=("prom", "wrong"))[0] == 401
    assert get(port, "/api/status", auth=("other", PASSWORD))[0] == 401
    assert get(port, "/api/status", auth=("prom", PASSWORD))[0] == 200
    auth = ("prom", PASSWORD)
    # allowed_hosts: the names listed and loopback ones; others get 421, before any password.
    assert get(port, "/api/status", auth=auth, host=f"scraper.example:{port}")[0] == 200
    code, headers, _ = get(port, "/api/status", auth=auth, host="rebind.example")
    assert code == 421 and "WWW-Authenticate" not in headers

    # 100 silent connections and a slowloris client: a scrape is answered, frames keep flowing.
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(100)]
    stop = threading.Event()

    def slowloris() -> None:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            while not stop.wait(0.2):
                try:
                    s.sendall(b"X-a: b\r\n")
                except OSError:
                    return

    dribbler = threading.Thread(target=slowloris, daemon=True)
    dribbler.start()
    try:
        published = len(sub.messages(f"{PREFIX}/{DEVICE}/cameras/cam/detections"))
        for _ in range(3):
            metrics = scrape(port, auth=auth, timeout=5)
            assert value(metrics, "yoloedge_device_up", accelerator="onnxruntime0", device="0") == 1
            assert value(metrics, "yoloedge_camera_up", camera="cam", accelerator="onnxruntime0") == 1
        assert sub.wait_for(lambda ms: len(ms) >= published + 4, 15,
                            topic=f"{PREFIX}/{DEVICE}/cameras/cam/detections"), "the pipeline stalled"
    finally:
        stop.set()
        dribbler.join(5)
        for s in idle:
            s.close()

    # Reload to another port: the old one closes, the new one serves; without allowed_hosts, a
    # remote listener answers any name.
    config["http"]["listen"] = f"0.0.0.0:{port2}"
    del config["http"]["allowed_hosts"]
    write_config(path, config)
    daemon.signal(signal.SIGHUP)
    notify.wait_for("READY", "1", timeout=30, count=3)
    assert status(sock)["daemon"]["generation"] == 3
    assert refused(port) and get(port2, "/api/status", auth=auth)[0] == 200
    assert get(port2, "/api/status", auth=auth, host="any.example")[0] == 200

    # A port that is taken: the reload is rejected and the endpoint stays where it was.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        config["http"]["listen"] = f"127.0.0.1:{busy}"
        write_config(path, config)
        daemon.signal(signal.SIGHUP)
        notify.wait_for("READY", "1", timeout=30, count=4)
        st = status(sock)
        assert st["daemon"]["generation"] == 3 and f"127.0.0.1:{busy}" in st["daemon"]["config_error"]
        assert get(port2, "/api/status", auth=auth)[0] == 200

    # Off.
    config["http"] = None
    write_config(path, config)
    daemon.signal(signal.SIGHUP)
    notify.wait_for("READY", "1", timeout=30, count=5)
    assert status(sock)["daemon"]["generation"] == 4 and refused(port2)

    assert daemon.stop() == 0, daemon.log[-3000:]
    for message in sub.messages():
        assert PASSWORD.encode() not in message.payload
    assert PASSWORD not in daemon.log and PASSWORD not in json.dumps(st)


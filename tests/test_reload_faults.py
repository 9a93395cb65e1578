"""Fault injection against the real daemon (real mosquitto, real model, real camera file): a reload
with a file that `check` refuses keeps the daemon running on its old configuration and shows the
error in status; starting with the same file exits 78 before anything starts."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import yaml

from daemon_harness import REPO, Daemon, NotifySocket, ctl, status, write_config
from test_config_hardening import SECRET, alias_bomb
from tls_files import TlsFiles, make_tls_files

pytestmark = pytest.mark.shared

DEVICE = "edge1"
PREFIX = "yt"


def base_config(tmp_path: Path, models: Path, media: Path, broker) -> dict:
    return {
        "device_id": DEVICE,
        "model": {"path": str(models / "yolov8n_coco_int8.onnx")},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [{"name": "cam", "url": str(media / "indoor_people_480p_mpeg4.avi"), "loop": True, "fps": 3}],
        "mqtt": {"host": broker.host, "port": broker.port, "topic_prefix": PREFIX, "stats_interval_s": 1},
        "health": {"stall_timeout_s": 5, "status_interval_s": 1},
        "control": {"socket": str(tmp_path / "run" / "control.sock")},
        "shutdown_timeout_s": 5,
    }


def _with_tls(file_attr: str) -> Callable[[dict, TlsFiles], str]:
    def build(config: dict, tls: TlsFiles) -> str:
        config["mqtt"]["tls"] = {"ca_certs": str(getattr(tls, file_attr))}
        return yaml.safe_dump(config, sort_keys=False)
    return build


def _bad_url(config: dict, tls: TlsFiles) -> str:
    config["cameras"][0]["url"] = f"rtsp://admin:{SECRET}@127.0.0.1:1/s\r\nX-Injected: 1"
    return yaml.safe_dump(config, sort_keys=False)


def _appended(tail: str) -> Callable[[dict, TlsFiles], str]:
    return lambda config, tls: yaml.safe_dump(config, sort_keys=False) + tail


FAULTS = [
    # (case, how the bad file is made from the good config, words in the error)
    ("der-ca", _with_tls("der"), "no PEM certificate"),
    ("empty-ca", _with_tls("empty"), "no PEM certificate"),
    ("key-as-ca", _with_tls("key"), "no PEM certificate"),
    ("alias-bomb", _appended(alias_bomb()), "aliases expand to more than"),
    ("deep-nesting", _appended("deep:\n" + "  - " * 5000 + "x\n"), "nested more than"),
    ("control-char-in-url", _bad_url, "must not contain control characters (found \\r"),
]


@pytest.fixture(scope="module")
def tls(tmp_path_factory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture()
def notify(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_rejected_reloads_keep_the_daemon_running_on_its_old_config(tmp_path, models, media, mosquitto, subscriber,
                                                                    notify, tls):
    config = base_config(tmp_path, models, media, mosquitto)
    path = write_config(tmp_path / "yoloedge.yaml", config)
    good = path.read_text()
    daemon = Daemon(path, notify)
    try:
        notify.wait_for("READY", "1", timeout=90)
        sock = config["control"]["socket"]
        detections = f"{PREFIX}/{DEVICE}/cameras/cam/detections"
        assert subscriber.wait_for(lambda ms: len(ms) >= 2, 30, topic=detections), daemon.log[-3000:]
        for n, (case, build, words) in enumerate(FAULTS, start=2):
            path.write_text(build(yaml.safe_load(good), tls))
            assert check(path).returncode == 78, case
            daemon.signal(signal.SIGHUP)
            notify.wait_for("READY", "1", timeout=30, count=n)
            st = status(sock)
            assert daemon.proc.poll() is None, (case, daemon.log[-3000:])
            assert st["daemon"]["generation"] == 1, case
            assert words in st["daemon"]["config_error"] and str(path) in st["daemon"]["config_error"], \
                (case, st["daemon"]["config_error"])
            assert [c["name"] for c in st["cameras"]] == ["cam"], case
            before = len(subscriber.messages(detections))
            assert subscriber.wait_for(lambda ms, before=before: len(ms) > before, 15, topic=detections), \
                (case, daemon.log[-3000:])
        path.write_text(good)
        result = ctl(sock, "reload")
        assert result.returncode == 0, result.stdout + result.stderr
        st = status(sock)
        assert st["daemon"]["generation"] == 2 and st["daemon"]["config_error"] is None
        assert daemon.stop() == 0, daemon.log[-4000:]
    finally:
        daemon.kill()
    assert "Traceback" not in daemon.log and SECRET not in daemon.log and "X-Injected" not in daemon.log


@pytest.mark.parametrize("case, build, words", FAULTS, ids=[f[0] for f in FAULTS])
def test_starting_with_a_bad_file_exits_78_before_anything_starts(tmp_path, models, media, mosquitto, notify, tls,
                                                                  case, build, words):
    config = base_config(tmp_path, models, media, mosquitto)
    path = tmp_path / "yoloedge.yaml"
    path.write_text(build(config, tls))
    daemon = Daemon(path, notify)
    try:
        assert daemon.proc.wait(60) == 78, daemon.log[-3000:]
    finally:
        daemon.kill()
    assert words in daemon.log and str(path) in daemon.log, daemon.log[-3000:]
    assert "Traceback" not in daemon.log and SECRET not in daemon.log
    assert notify.messages == [] and not Path(config["control"]["socket"]).exists()


def test_a_broker_client_that_cannot_start_is_replaced_by_one_with_the_old_settings(tmp_path, models, mosquitto,
                                                                                    subscriber, tls):
    """A CA file can change between loading the new file and applying it (a certificate being
    rotated): the new client fails, and the daemon must reconnect with the settings that worked."""
    from yoloedge.config.loader import load_config
    from yoloedge.daemon import Daemon as InProcessDaemon

    config = {"device_id": DEVICE, "model": {"path": str(models / "yolov8n_coco_int8.onnx")}, "cameras": [],
              "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": PREFIX},
              "control": {"socket": str(tmp_path / "control.sock")}}
    path = write_config(tmp_path / "yoloedge.yaml", config)
    daemon = InProcessDaemon(load_config(str(path), {}), str(path), {})
    daemon._start_publisher(daemon.config).set_status("online")
    first = daemon.publisher
    assert subscriber.wait_for(lambda ms: len(ms) == 1, 10, topic=f"{PREFIX}/{DEVICE}/status")
    ca = tmp_path / "ca.pem"
    ca.write_bytes(tls.cert.read_bytes())
    config["mqtt"].update(topic_prefix="new", tls={"ca_certs": str(ca)})
    new = load_config(str(write_config(path, config)), {})
    ca.write_bytes(tls.der.read_bytes())  # rotated to a file the client cannot use
    old = daemon.config
    try:
        with pytest.raises(Exception, match="no PEM certificate"):
            daemon.reloader.apply(new)
        assert daemon.config is old
        assert daemon.publisher is not None and daemon.publisher is not first
        assert daemon.publisher.topics.status == f"{PREFIX}/{DEVICE}/status"
        assert subscriber.wait_for(lambda ms: len(ms) >= 2 and ms[-1].json()["state"] == "online", 10,
                                   topic=f"{PREFIX}/{DEVICE}/status")
        assert daemon.publisher.stats()["connected"]
    finally:
        if daemon.publisher is not None:
            daemon.publisher.stop(timeout_s=2)


def _in_process_daemon(tmp_path: Path, models: Path, mosquitto, **mqtt):
    from yoloedge.config.loader import load_config
    from yoloedge.daemon import Daemon as InProcessDaemon

    config = {"device_id": DEVICE, "model": {"path": str(models / "yolov8n_coco_int8.onnx")}, "cameras": [],
              "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": PREFIX, **mqtt},
              "control": {"socket": str(tmp_path / "control.sock")}}
    path = write_config(tmp_path / "yoloedge.yaml", config)
    return InProcessDaemon(load_config(str(path), {}), str(path), {}), config, path


def test_a_client_that_fails_half_way_through_starting_releases_its_spool(tmp_path, models, mosquitto,
                                                                          monkeypatch):
    """Its network thread cannot start (threads exhausted): the half-started client is stopped, so
    the fallback client (same spool directory) can open the spool, and no spool thread is left."""
    import threading
    import time

    import paho.mqtt.client as mqtt

    from yoloedge.publish.spool import Spool

    spool_dir = tmp_path / "spool"
    daemon, _, _ = _in_process_daemon(tmp_path, models, mosquitto, spool_dir=str(spool_dir))

    def no_thread(self) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(mqtt.Client, "loop_start", no_thread)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        daemon.reloader.online_publisher(daemon.config.mqtt)
    monkeypatch.undo()
    spool = Spool(str(spool_dir), limit_bytes=1 << 20)
    assert spool.open() == 0  # not "in use by another process"
    spool.close()
    deadline = time.monotonic() + 5
    while any(t.name == "mqtt-drain" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.name == "mqtt-drain" for t in threading.enumerate())


def test_the_publisher_goes_back_even_when_putting_the_cameras_back_fails(tmp_path, models, mosquitto,
                                                                          subscriber, monkeypatch):
    daemon, config, path = _in_process_daemon(tmp_path, models, mosquitto)
    from yoloedge.config.loader import load_config

    daemon._start_publisher(daemon.config).set_status("online")
    config["mqtt"]["topic_prefix"] = "new"
    new = load_config(str(write_config(path, config)), {})
    calls: list[str] = []

    def cameras_fail(old, new, strict=True) -> None:
        calls.append("apply" if strict else "rollback")
        raise RuntimeError(f"camera failure during {calls[-1]}")

    monkeypatch.setattr(daemon.cameras, "apply", cameras_fail)
    try:
        with pytest.raises(RuntimeError, match="during rollback"):
            daemon.reloader.apply(new)
        assert calls == ["apply", "rollback"]
        assert daemon.publisher is not None
        assert daemon.publisher.topics.status == f"{PREFIX}/{DEVICE}/status"  # the old settings
        assert daemon.publisher.wait_connected(10)
    finally:
        if daemon.publisher is not None:
            daemon.publisher.stop(timeout_s=2)

"""One daemon per control socket: a second one refuses to start (exit 73, naming the first's pid)
before it touches MQTT or a device, also when both start at the same instant; a crashed daemon's
socket and lock file do not block the next one. Real daemons, real mosquitto."""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from daemon_harness import Daemon, NotifySocket, status, write_config
from yoloedge import demo
from yoloedge.config.errors import EX_CONFIG
from yoloedge.control.instance import AlreadyRunning, InstanceLock, lock_path
from yoloedge.control.server import ControlServer
from yoloedge.daemon import EXIT_ALREADY_RUNNING

PREFIX = "si"


@pytest.fixture
def config(tmp_path, sock_dir, mosquitto) -> Path:
    return write_config(tmp_path / "yoloedge.yaml", {
        "device_id": "one",
        "model": {"path": str(demo.MODEL)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [],
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": PREFIX},
        "control": {"socket": str(sock_dir / "control.sock")},
        "shutdown_timeout_s": 5,
    })


@pytest.fixture
def daemons(tmp_path):
    notify = NotifySocket(tmp_path / "notify.sock")
    started: list[Daemon] = []

    def start(config: Path) -> Daemon:
        daemon = Daemon(config, notify)
        started.append(daemon)
        return daemon

    start.notify = notify  # type: ignore[attr-defined]
    yield start
    for daemon in started:
        daemon.kill()
    notify.close()


def wait_exit(daemon: Daemon, timeout: float = 60.0) -> int:
    return daemon.proc.wait(timeout)


def refusal(socket_path: str, pid: int) -> str:
    return f"another yoloedge is running with control socket {socket_path} (pid {pid})"


def statuses(subscriber) -> list[str]:
    return [p["state"] for p in subscriber.payloads(f"{PREFIX}/one/status")]


def sessions(mosquitto, client_id: str) -> int:
    """Connections the broker accepted under `client_id` (it logs each one)."""
    return mosquitto.log_text().count(f" as {client_id} ")


def test_a_second_daemon_refuses_to_start_before_touching_mqtt(config, sock_dir, daemons, subscriber, mosquitto):
    first = daemons(config)
    daemons.notify.wait_for("READY", "1", timeout=60)
    assert subscriber.wait_for(lambda ms: "online" in statuses(subscriber), 10)
    assert sessions(mosquitto, "yoloedge-one") == 1
    second = daemons(config)
    assert wait_exit(second) == EXIT_ALREADY_RUNNING, second.log
    assert refusal(str(sock_dir / "control.sock"), first.proc.pid) in second.log
    assert "MQTT" not in second.log and "loaded" not in second.log, second.log  # no broker, no model
    # The second one has exited: had it connected, the broker would have logged its session (and
    # closed the first's), and the first would have gone offline and come back.
    assert sessions(mosquitto, "yoloedge-one") == 1, mosquitto.log_text()
    assert statuses(subscriber) == ["online"], "the first daemon's MQTT session was never disturbed"
    assert first.proc.poll() is None
    assert status(str(sock_dir / "control.sock"))["daemon"]["pid"] == first.proc.pid
    assert first.stop() == 0, first.log


def test_two_daemons_started_at_the_same_instant_one_runs(config, sock_dir, daemons):
    pair = [daemons(config), daemons(config)]
    deadline = time.monotonic() + 60
    while all(d.proc.poll() is None for d in pair) and time.monotonic() < deadline:
        time.sleep(0.05)
    losers = [d for d in pair if d.proc.poll() is not None]
    assert len(losers) == 1, [d.log for d in pair]
    loser, winner = losers[0], next(d for d in pair if d is not losers[0])
    assert loser.proc.returncode == EXIT_ALREADY_RUNNING, loser.log
    assert refusal(str(sock_dir / "control.sock"), winner.proc.pid) in loser.log, loser.log
    daemons.notify.wait_for("READY", "1", timeout=60)
    assert status(str(sock_dir / "control.sock"))["daemon"]["pid"] == winner.proc.pid
    assert winner.stop() == 0, winner.log


def test_a_crashed_daemons_socket_and_lock_do_not_block_the_next(config, sock_dir, daemons):
    crashed = daemons(config)
    daemons.notify.wait_for("READY", "1", timeout=60)
    crashed.proc.send_signal(signal.SIGKILL)
    crashed.proc.wait(10)
    assert (sock_dir / "control.sock").exists() and (sock_dir / "control.sock.lock").exists()
    following = daemons(config)
    daemons.notify.wait_for("READY", "1", timeout=60, count=2)
    assert status(str(sock_dir / "control.sock"))["daemon"]["pid"] == following.proc.pid
    assert "removing stale control socket" in following.log
    assert following.stop() == 0, following.log


def test_a_file_in_the_way_of_the_socket_is_a_config_error_and_is_left_alone(tmp_path, config, sock_dir, daemons):
    """A file where the socket goes used to cost the daemon its socket and (before that) its
    instance lock, so a second one could start beside it. It is now refused before anything
    starts; the case of a file that appears later is covered in process (tests/test_control.py)."""
    (sock_dir / "control.sock").write_text("not a socket\n")
    first = daemons(config)
    assert wait_exit(first, 30) == EX_CONFIG, first.log
    assert "control.socket" in first.log and "MQTT" not in first.log, first.log
    assert (sock_dir / "control.sock").read_text() == "not a socket\n", "the user's file is untouched"


def test_a_lock_file_that_cannot_be_created_refuses_to_start(tmp_path, mosquitto, daemons):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    socket_path = blocker / "control.sock"  # its directory is a file: nothing can be created there
    config = write_config(tmp_path / "nolock.yaml", {
        "device_id": "one", "model": {"path": str(demo.MODEL)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [], "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": PREFIX},
        "control": {"socket": str(socket_path)}, "shutdown_timeout_s": 5})
    daemon = daemons(config)
    assert wait_exit(daemon, 30) == EXIT_ALREADY_RUNNING, daemon.log
    assert f"not starting: cannot create lock file {socket_path}.lock" in daemon.log, daemon.log
    assert "MQTT" not in daemon.log, daemon.log


# --- the parts, in process -----------------------------------------------------------------------


def test_lock_held_before_the_socket_exists_refuses_with_the_holders_pid(sock_dir):
    path = str(sock_dir / "control.sock")
    held = InstanceLock(path)
    held.acquire()
    try:
        with pytest.raises(AlreadyRunning) as raised:
            ControlServer(path, 0o660, lambda r: {"ok": True}).start()
        assert raised.value.pid == os.getpid() and path in str(raised.value)
        assert not os.path.exists(path), "the loser created nothing"
    finally:
        held.release()
    with ControlServer(path, 0o660, lambda r: {"ok": True}):
        assert open(lock_path(path)).read().strip() == str(os.getpid())


def test_a_live_socket_without_a_lock_refuses_with_the_peers_pid(sock_dir):
    """An older daemon holds no lock file: its socket still answers, and SO_PEERCRED names it."""
    path = str(sock_dir / "control.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as older:
        older.bind(path)
        older.listen(1)
        with pytest.raises(AlreadyRunning) as raised:
            ControlServer(path, 0o660, lambda r: {"ok": True}).start()
    assert raised.value.pid == os.getpid()
    assert os.path.exists(path), "a live daemon's socket is never removed"


def test_a_live_socket_with_a_full_accept_queue_refuses(sock_dir):
    """A Unix socket whose accept queue is full refuses a connection with EAGAIN: that daemon is
    alive, just busy, and must not be taken for a crashed one (nor the error for "no socket")."""
    path = str(sock_dir / "control.sock")
    queued: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as busy:
        busy.bind(path)
        busy.listen(0)
        try:
            while True:
                client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                client.setblocking(False)
                try:
                    client.connect(path)
                except BlockingIOError:
                    client.close()
                    break
                queued.append(client)
            with pytest.raises(AlreadyRunning):
                ControlServer(path, 0o660, lambda r: {"ok": True}).start()
        finally:
            for client in queued:
                client.close()
    assert os.path.exists(path), "a live daemon's socket is never removed"


def test_stop_releases_the_lock_for_a_restart(sock_dir):
    path = str(sock_dir / "control.sock")
    server = ControlServer(path, 0o660, lambda r: {"ok": True})
    server.start()
    server.stop()
    again = InstanceLock(path)
    again.acquire()
    again.release()
    assert sorted(os.listdir(sock_dir)) == ["control.sock.lock"]

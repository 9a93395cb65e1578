"""Signals during start-up: `yoloedge run` holds every signal it handles (SIGHUP, SIGTERM, SIGINT,
SIGUSR1, SIGXCPU and those it ignores) back from its first line until its handlers are in place.
A SIGHUP storm during start-up must not kill it (it used to die with 129, which systemd counts as
clean), nor a storm of SIGUSR1/SIGUSR2/SIGALRM/realtime signals (each used to kill it silently);
a SIGTERM during start-up ends it cleanly (exit 0).

The process is signalled from the moment its mask shows the signals blocked, i.e. from the first
line of yoloedge; before that only the interpreter's own start-up runs, which no Python code can
protect (see docs/how-it-works.md, "Signals and shutdown")."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from daemon_harness import Daemon, NotifySocket, status, write_config
from yoloedge import demo
from yoloedge.cli.main import main


@pytest.fixture
def config(tmp_path, sock_dir, mosquitto) -> Path:
    return write_config(tmp_path / "yoloedge.yaml", {
        "device_id": "sig",
        "model": {"path": str(demo.MODEL)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [],
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": "sg"},
        "control": {"socket": str(sock_dir / "control.sock")},
        "shutdown_timeout_s": 5,
    })


@pytest.fixture
def notify(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def blocked_signals(pid: int) -> int:
    """The main thread's blocked-signal mask (bit n-1 for signal n); 0 once the process is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigBlk:"):
                return int(line.split()[1], 16)
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def wait_until_held(daemon: Daemon, timeout: float = 30.0) -> float:
    """Seconds from spawn until SIGHUP shows blocked (the first line of yoloedge ran)."""
    started = time.monotonic()
    while not blocked_signals(daemon.proc.pid) & (1 << (signal.SIGHUP - 1)):
        assert daemon.proc.poll() is None, daemon.log
        assert time.monotonic() - started < timeout, "the signals were never held"
        time.sleep(0.0005)
    return time.monotonic() - started


def wait_for_text(daemon: Daemon, text: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in daemon.log:
        assert daemon.proc.poll() is None, daemon.log
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{daemon.log}"
        time.sleep(0.05)


def test_sighup_storm_during_start_up_does_not_kill_the_daemon(config, sock_dir, notify):
    daemon = Daemon(config, notify)
    try:
        wait_until_held(daemon)
        sent = 0
        while not notify.with_key("READY", "1"):
            assert daemon.proc.poll() is None, f"died with {daemon.proc.returncode} after {sent} SIGHUPs"
            daemon.signal(signal.SIGHUP)
            sent += 1
            time.sleep(0.002)
        assert sent > 10, "the storm covered the start-up"
        deadline = time.monotonic() + 15
        while status(str(sock_dir / "control.sock"))["daemon"]["generation"] < 2:
            assert time.monotonic() < deadline, "the reload asked for during start-up was not applied"
            time.sleep(0.1)
        assert daemon.proc.poll() is None
        assert status(str(sock_dir / "control.sock"))["daemon"]["state"] == "running"
        assert daemon.stop() == 0, daemon.log
        assert "Traceback" not in daemon.log, daemon.log
    finally:
        daemon.kill()


def test_signals_it_ignores_sent_all_through_start_up_are_logged_once_it_runs(config, sock_dir, notify):
    storm = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM, signal.SIGPROF, signal.SIGRTMIN + 2]
    daemon = Daemon(config, notify)
    try:
        wait_until_held(daemon)
        held = blocked_signals(daemon.proc.pid)
        assert all(held & (1 << (sig - 1)) for sig in storm), f"not all held back: {held:x}"
        sent = 0
        while not notify.with_key("READY", "1"):
            assert daemon.proc.poll() is None, f"died with {daemon.proc.returncode} after {sent} signals"
            daemon.signal(storm[sent % len(storm)])
            sent += 1
            time.sleep(0.002)
        assert sent > 10, "the storm covered the start-up"
        for text in ("received SIGUSR2", "received SIGALRM", "received SIGPROF", "received SIGRTMIN+2",
                     "status follows"):
            wait_for_text(daemon, text)
        assert status(str(sock_dir / "control.sock"))["daemon"]["state"] == "running"
        assert daemon.stop() == 0, daemon.log
        assert "Traceback" not in daemon.log, daemon.log
    finally:
        daemon.kill()


def test_sigterm_during_start_up_is_a_clean_stop(config, notify):
    daemon = Daemon(config, notify)
    try:
        wait_until_held(daemon)
        daemon.signal(signal.SIGTERM)
        assert daemon.proc.wait(60) == 0, daemon.log  # not -15: handled, not killed
        assert not notify.with_key("READY", "1"), "stopped before it ever became ready"
    finally:
        daemon.kill()


def test_other_commands_leave_the_signal_mask_as_they_found_it(tmp_path, capsys):
    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with pytest.raises(SystemExit):
        main(["--version"])
    assert main(["check", "-c", str(tmp_path / "absent.yaml")]) != 0
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before

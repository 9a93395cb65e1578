"""Signals that should not end the daemon do not: the real daemon (a subprocess, real mosquitto,
the demo model on ONNX Runtime, a synthetic camera) is sent each signal whose default action
would have killed it silently, logs one line and runs on; SIGTERM then still stops it cleanly,
with `stopped` on MQTT. SIGXCPU (the CPU time limit) stops it cleanly with exit 1. What each
signal means is in `yoloedge.health.signals`; the start-up case is in test_startup_signals.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from daemon_harness import REPO, Daemon, NotifySocket, write_config
from yoloedge import demo
from yoloedge.health.signals import (IGNORED_LOG_INTERVAL_S, SIGNAL_ACTIONS, STATUS_LOG_INTERVAL_S, SignalAction,
                                     SignalInbox, signal_name)

DEVICE, PREFIX = "sig", "sg"
#: each signal that ends a process by default and that an operator or a tool may send
IGNORED = [signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO, signal.SIGPWR,
           signal.SIGSTKFLT, signal.SIGRTMIN, signal.SIGRTMIN + 5, signal.SIGRTMAX]


@pytest.fixture
def config(tmp_path, sock_dir, mosquitto) -> Path:
    return write_config(tmp_path / "yoloedge.yaml", {
        "device_id": DEVICE,
        "model": {"path": str(demo.MODEL)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [{"name": "gate", "url": "synthetic://320x240?fps=2"}],
        "mqtt": {"host": mosquitto.host, "port": mosquitto.port, "topic_prefix": PREFIX},
        "control": {"socket": str(sock_dir / "control.sock")},
        "http": None,
        "shutdown_timeout_s": 5,
    })


@pytest.fixture
def notify(tmp_path):
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


def wait_for_log(daemon: Daemon, text: str, count: int = 1, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while daemon.log.count(text) < count:
        assert daemon.proc.poll() is None, f"died with {daemon.proc.returncode}:\n{daemon.log}"
        assert time.monotonic() < deadline, f"{text!r} not logged {count} time(s):\n{daemon.log}"
        time.sleep(0.05)


def thread_masks(pid: int) -> dict[int, int]:
    """Each thread's blocked-signal mask (bit n-1 for signal n), by thread id."""
    masks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("SigBlk:"):
                masks[int(task.name)] = int(line.split()[1], 16)
    return masks


def status_topic_states(subscriber) -> list[str]:
    return [json.loads(m.payload)["state"] for m in subscriber.messages(f"{PREFIX}/{DEVICE}/status") if m.payload]


def test_each_signal_that_would_kill_the_daemon_is_logged_once_and_it_runs_on(config, notify, subscriber):
    daemon = Daemon(config, notify)
    try:
        notify.wait_for("READY", "1", timeout=90)
        # Signals never land on the main thread (its alternate signal stack is small: different
        # signals nesting there overran it) but on the one thread that takes them all.
        everything = sum(1 << (sig - 1) for sig in SIGNAL_ACTIONS)
        masks = thread_masks(daemon.proc.pid)
        assert masks[daemon.proc.pid] & everything == everything
        takers = [tid for tid, mask in masks.items() if not mask & everything]
        assert len(takers) == 1, {tid: f"{mask:x}" for tid, mask in masks.items()}
        for sig in IGNORED:
            line = f"received {signal_name(sig)}: ignored"
            daemon.signal(sig)
            wait_for_log(daemon, line)
            assert daemon.log.count(line) == 1
        # Python ignores these two itself: the write that raised one fails where it happened
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            daemon.signal(sig)
        daemon.signal(signal.SIGUSR1)  # the status summary, as `yoloedge-ctl status` prints it
        wait_for_log(daemon, "SIGUSR1: status follows")
        summary = daemon.log.split("SIGUSR1: status follows", 1)[1]
        assert "yoloedge" in summary and "running" in summary and "gate" in summary
        assert daemon.proc.poll() is None
        assert status_topic_states(subscriber)[-1:] == ["online"]
        assert daemon.stop() == 0, daemon.log
        assert subscriber.wait_for(lambda ms: status_topic_states(subscriber)[-1:] == ["stopped"], 10), \
            status_topic_states(subscriber)
        assert "Traceback" not in daemon.log, daemon.log
        assert "SIGPIPE" not in daemon.log and "SIGXFSZ" not in daemon.log
    finally:
        daemon.kill()


def test_sigxcpu_stops_cleanly_with_exit_status_1(config, notify, subscriber):
    """The soft CPU limit's warning: stop while we can, before the hard limit's SIGKILL. It is sent
    again every CPU second, which must not count as the second signal that exits at once."""
    daemon = Daemon(config, notify)
    try:
        notify.wait_for("READY", "1", timeout=90)
        daemon.signal(signal.SIGXCPU)
        daemon.signal(signal.SIGXCPU)
        assert daemon.proc.wait(30) == 1, daemon.log
        assert "SIGXCPU: the CPU time limit" in daemon.log
        assert "second signal" not in daemon.log
        assert subscriber.wait_for(lambda ms: status_topic_states(subscriber)[-1:] == ["stopped"], 10), \
            status_topic_states(subscriber)
    finally:
        daemon.kill()


# -- the inbox the signal thread writes to, on an injected clock ---------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_signal_sent_in_a_loop_is_logged_once_then_once_an_interval_with_its_count():
    clock = Clock()
    inbox = SignalInbox(clock)
    inbox.record(signal.SIGUSR2)
    assert inbox.due() == [(signal.SIGUSR2, 1)]
    for _ in range(50):
        inbox.record(signal.SIGUSR2)
    assert inbox.due() == []  # counted, not logged again yet
    clock.now += IGNORED_LOG_INTERVAL_S - 1
    assert inbox.due() == []
    clock.now += 1
    assert inbox.due() == [(signal.SIGUSR2, 50)]
    assert inbox.due() == []
    # the status is written at most once per its own, shorter interval
    inbox.record(signal.SIGUSR1)
    inbox.record(signal.SIGUSR1)
    assert inbox.due() == [(signal.SIGUSR1, 2)]
    inbox.record(signal.SIGUSR1)
    assert inbox.due() == []
    clock.now += STATUS_LOG_INTERVAL_S
    assert inbox.due() == [(signal.SIGUSR1, 1)]
    # at shutdown whatever waits is taken at once
    inbox.record(signal.SIGUSR2)
    assert inbox.due() == [] and inbox.due(flush=True) == [(signal.SIGUSR2, 1)]


HOLDING_THE_RELOAD_FLAG = """
import os, signal, sys
from yoloedge.config.loader import load_config
from yoloedge.daemon import Daemon

daemon = Daemon(load_config(sys.argv[1], {}), sys.argv[1], {})
daemon.signals.install()
with daemon.reloader.requested._cond:  # what the main loop holds while it clears the reload flag
    os.kill(os.getpid(), signal.SIGHUP)  # to the process: taken by the signal thread
    for _ in range(10000):  # bytecodes: where a Python-level handler would run, on this thread
        pass
print("reload requested:", daemon.reloader.requested.wait(10), flush=True)
"""


def test_a_signal_arriving_while_the_main_thread_holds_a_flags_lock_does_not_hang_the_daemon(config):
    """A handler that set the reload flag itself (`Event.set()` takes the event's lock) ran on the
    main thread, inside whatever it interrupted: there, holding that lock, it waited for itself
    for good (and a storm of SIGHUPs nested handlers until the stack overflowed)."""
    result = subprocess.run([sys.executable, "-c", HOLDING_THE_RELOAD_FLAG, str(config)], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "reload requested: True" in result.stdout, result.stdout + result.stderr


def test_every_signal_that_ends_a_process_by_default_has_a_meaning():
    """The table holds what `kill -l` lists with a default action of 'terminate' (Linux, man 7
    signal), except SIGKILL (cannot be caught) and SIGPIPE (Python ignores it)."""
    terminating = {signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM,
                   signal.SIGTERM, signal.SIGSTKFLT, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO,
                   signal.SIGPWR, *range(signal.SIGRTMIN, signal.SIGRTMAX + 1)}
    assert terminating <= set(SIGNAL_ACTIONS)
    assert SIGNAL_ACTIONS[signal.SIGUSR1] is SignalAction.LOG_STATUS
    assert SIGNAL_ACTIONS[signal.SIGXCPU] is SignalAction.CPU_LIMIT
    assert signal.getsignal(signal.SIGPIPE) is signal.SIG_IGN and signal.getsignal(signal.SIGXFSZ) is signal.SIG_IGN
    for left_alone in (signal.SIGQUIT, signal.SIGSEGV, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU,
                       signal.SIGCHLD, signal.SIGURG, signal.SIGWINCH, signal.SIGCONT):
        assert left_alone not in SIGNAL_ACTIONS

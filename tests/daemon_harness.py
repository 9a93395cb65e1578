"""Run the real daemon as a subprocess, with a test-owned NOTIFY_SOCKET, and read what it says."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


class NotifySocket:
    """A datagram socket standing in for systemd's notify socket; records every message."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.2)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._running = True
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while self._running:
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            with self._lock:
                self.messages.append((time.monotonic(), fields))

    def with_key(self, key: str, value: str | None = None) -> list[tuple[float, dict]]:
        with self._lock:
            return [(t, m) for t, m in self.messages if key in m and (value is None or m[key] == value)]

    def wait_for(self, key: str, value: str | None = None, timeout: float = 60.0, count: int = 1) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.with_key(key, value)
            if len(found) >= count:
                return found[count - 1][0]
            time.sleep(0.05)
        raise TimeoutError(f"no {key}={value} from the daemon within {timeout} s; got {self.messages[-5:]}")

    def close(self) -> None:
        self._running = False
        self.sock.close()


class Daemon:
    """`python -m yoloedge run -c CONFIG` with its stderr collected."""

    def __init__(self, config_path: Path, notify: NotifySocket | None, env: dict | None = None,
                 watchdog_usec: int | None = None):
        full_env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        full_env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "fakes"), str(REPO)])
        if notify is not None:
            full_env["NOTIFY_SOCKET"] = notify.path
        if watchdog_usec:
            full_env["WATCHDOG_USEC"] = str(watchdog_usec)
        full_env.update(env or {})
        self.proc = subprocess.Popen([sys.executable, "-m", "yoloedge", "run", "-c", str(config_path)],
                                     cwd=REPO, env=full_env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)

    @property
    def log(self) -> str:
        return "".join(self.output)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def write_config(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def ctl(socket_path: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge.cli.ctl", "--socket", socket_path, *args],
                          cwd=REPO, capture_output=True, text=True, timeout=30)


def status(socket_path: str) -> dict:
    result = ctl(socket_path, "status", "--json")
    return json.loads(result.stdout)

"""A private mosquitto on a free loopback port, for `yoloedge demo` and `yoloedge bench`.

Both need a real broker so that what they show includes MQTT's cost, and neither may touch a
broker the user already runs: this one lives in a temporary directory and dies with the command.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"
INSTALL_HINT = "sudo apt-get install mosquitto"


def find_mosquitto() -> str | None:
    found = shutil.which("mosquitto")
    if found:
        return found
    candidate = Path("/usr/sbin/mosquitto")
    return str(candidate) if candidate.exists() else None


def mosquitto_or_say(command: str) -> str | None:
    """The mosquitto binary, or None after telling stderr that `command` needs it and how to install it."""
    binary = find_mosquitto()
    if binary is None:
        print(f"{command}: needs the mosquitto MQTT broker ({INSTALL_HINT})", file=sys.stderr)
    return binary


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_broker(binary: str, workdir: Path, port: int) -> subprocess.Popen:
    conf = workdir / "mosquitto.conf"
    lines = [f"listener {port} {HOST}", "allow_anonymous true", "persistence false", "log_dest none"]
    if os.geteuid() == 0:
        lines.append("user root")  # else it drops to 'mosquitto', which cannot read our temp dir
    conf.write_text("\n".join(lines) + "\n")
    # its own session: a Ctrl-C meant for the demo or a benchmark must not take the broker away
    # before they have finished (they stop it themselves)
    proc = subprocess.Popen([binary, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((HOST, port), timeout=0.2):
                return proc
        except OSError:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                raise RuntimeError(f"mosquitto exited: {err}") from None
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("mosquitto did not start listening within 10 s")

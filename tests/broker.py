"""A real mosquitto broker and an MQTT subscriber for tests (fixtures in conftest_mqtt.py).

`Mosquitto` runs /usr/sbin/mosquitto as a foreground child on a free 127.0.0.1 port with a
generated config in its own directory; it can be stopped, killed and restarted on the SAME port
(to test reconnects), and optionally requires a password or speaks TLS with a self-signed
certificate. `Subscriber` is a paho client that records every message it receives.

Pitfalls handled here (see ../shared/research/infra.md section 1):
* Started as root, mosquitto drops to user `mosquitto` before reading password/cert files,
  which then cannot read a 0700 temp dir: the config says `user root` when we are root.
* Python's TLS checks the IP address against the certificate's subjectAltName, not its CN:
  the self-signed certificate carries subjectAltName=IP:127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

HOST = "127.0.0.1"


def find_program(name: str) -> str | None:
    """Path of `name` on PATH or in /usr/sbin (not on a normal user's PATH), else None."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path("/usr/sbin") / name
    return str(candidate) if candidate.is_file() and os.access(candidate, os.X_OK) else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


class Mosquitto:
    """One mosquitto process. `users` ({name: password}) turns anonymous access off; `tls`
    serves TLS on the port (the client's CA file is `ca_cert`); `persistence` keeps retained
    messages and persistent sessions across stop()/restart() (not across kill())."""

    def __init__(self, workdir: Path, *, users: Mapping[str, str] | None = None, tls: bool = False,
                 persistence: bool = False, port: int | None = None):
        binary = find_program("mosquitto")
        if binary is None:
            raise RuntimeError("mosquitto is not installed (apt-get install mosquitto)")
        self.binary = binary
        self.workdir = Path(workdir)
        self.users = dict(users or {})
        self.tls = tls
        self.persistence = persistence
        self.port = port or free_port()
        self.host = HOST
        self.ca_cert: Path | None = None
        self.log_path = self.workdir / "mosquitto.log"
        self._proc: subprocess.Popen | None = None
        self._config_path: Path | None = None

    # -------------------------------------------------------------- set-up

    def _prepare(self) -> Path:
        """Write the config (and password file, certificate) once; restarts reuse them."""
        if self._config_path is not None:
            return self._config_path
        self.workdir.mkdir(parents=True, exist_ok=True)
        lines = [f"listener {self.port} {HOST}", "log_dest stderr", "log_type all",
                 "connection_messages true",
                 # the default (1000 per client) silently drops QoS 1 messages for a slow or
                 # offline subscriber, which tests would misread as the publisher losing them
                 "max_queued_messages 1000000"]
        if os.geteuid() == 0:
            lines.append("user root")
        if self.persistence:
            lines += ["persistence true", f"persistence_location {self.workdir}/",
                      "autosave_interval 1"]
        else:
            lines.append("persistence false")
        if self.users:
            lines += ["allow_anonymous false", f"password_file {self._write_passwords()}"]
        else:
            lines.append("allow_anonymous true")
        if self.tls:
            cert, key = self._write_certificate()
            lines += [f"certfile {cert}", f"keyfile {key}"]
        path = self.workdir / "mosquitto.conf"
        path.write_text("\n".join(lines) + "\n")
        self._config_path = path
        return path

    def _write_passwords(self) -> Path:
        tool = find_program("mosquitto_passwd")
        if tool is None:
            raise RuntimeError("mosquitto_passwd is not installed (it comes with mosquitto)")
        path = self.workdir / "passwd"
        for i, (user, password) in enumerate(self.users.items()):
            flags = ["-c", "-b"] if i == 0 else ["-b"]
            subprocess.run([tool, *flags, str(path), user, password], check=True,
                           capture_output=True, timeout=30)
        return path

    def _write_certificate(self) -> tuple[Path, Path]:
        """Self-signed server certificate, also used by clients as their CA file."""
        tool = find_program("openssl")
        if tool is None:
            raise RuntimeError("openssl is not installed")
        cert, key = self.workdir / "server.crt", self.workdir / "server.key"
        subprocess.run([tool, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
                        "-out", str(cert), "-days", "2", "-subj", f"/CN={HOST}",
                        "-addext", f"subjectAltName=IP:{HOST},DNS:localhost"],
                       check=True, capture_output=True, timeout=60)
        self.ca_cert = cert
        return cert, key

    # -------------------------------------------------------------- process control

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> "Mosquitto":
        """Start and wait until the port accepts connections."""
        if self.running:
            raise RuntimeError("mosquitto is already running")
        config = self._prepare()
        log = open(self.log_path, "ab")
        try:
            self._proc = subprocess.Popen([self.binary, "-c", str(config)], stdout=log,
                                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        while not _port_open(self.port):
            if self._proc.poll() is not None:
                raise RuntimeError(f"mosquitto exited with rc {self._proc.returncode}:\n"
                                   f"{self.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"mosquitto did not listen on {self.port} within {timeout} s:\n"
                                   f"{self.log_text()[-3000:]}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (clean shutdown: persistence is saved) and wait; kill if it hangs."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL: the broker vanishes without a word, like a power cut."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.kill()
        proc.wait(10)

    def restart(self, down_s: float = 0.0) -> "Mosquitto":
        """stop(), stay down `down_s` seconds, start() again on the same port."""
        self.stop()
        if down_s > 0:
            time.sleep(down_s)
        return self.start()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> "Mosquitto":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"Mosquitto({HOST}:{self.port}, tls={self.tls}, users={list(self.users)})"


@dataclass(frozen=True)
class Received:
    """One message as the subscriber got it."""

    topic: str
    payload: bytes
    qos: int
    retain: bool

    def json(self) -> object:
        return json.loads(self.payload.decode("utf-8"))


class Subscriber:
    """A paho client that subscribes to `topics` and records every message, thread-safely.

    With `clean_session=False` (and a fixed client_id) the broker keeps the subscription and
    queues QoS >= 1 messages while the subscriber is away, e.g. across a broker restart with
    persistence; otherwise it re-subscribes after each reconnect.
    """

    def __init__(self, host: str, port: int, topics: Iterable[str] = ("#",), *, qos: int = 1,
                 client_id: str | None = None, clean_session: bool = True,
                 username: str | None = None, password: str | None = None,
                 ca_certs: str | Path | None = None):
        if not clean_session and not client_id:
            raise ValueError("a persistent session needs a fixed client_id")
        self.host, self.port = host, port
        self.topics = list(topics)
        self.qos = qos
        self._cond = threading.Condition()
        self._messages: list[Received] = []
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id or "",
                                  clean_session=clean_session, protocol=mqtt.MQTTv311)
        if username is not None:
            self.client.username_pw_set(username, password)
        if ca_certs is not None:
            self.client.tls_set(ca_certs=str(ca_certs))
        self.client.reconnect_delay_set(0.05, 0.5)  # type: ignore[arg-type]
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message

    @classmethod
    def for_broker(cls, broker: Mosquitto, topics: Iterable[str] = ("#",), **options: object
                   ) -> "Subscriber":
        """A subscriber for `broker`, with its CA file and (by default) its first user."""
        if broker.users and "username" not in options:
            user, password = next(iter(broker.users.items()))
            options = {"username": user, "password": password, **options}
        if broker.tls and "ca_certs" not in options:
            options["ca_certs"] = broker.ca_cert
        return cls(broker.host, broker.port, topics, **options)  # type: ignore[arg-type]

    def start(self, timeout: float = 5.0) -> "Subscriber":
        """Connect and wait for the first SUBACK (or the restored session)."""
        self.client.connect_async(self.host, self.port, keepalive=5)
        self.client.loop_start()
        if not self._subscribed.wait(timeout):
            self.stop()
            raise TimeoutError(f"subscriber not subscribed to {self.host}:{self.port} in {timeout} s")
        return self

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        if reason_code.is_failure:
            return
        if flags.session_present:
            self._subscribed.set()  # the broker kept our subscriptions
            return
        client.subscribe([(t, self.qos) for t in self.topics])

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        self._subscribed.set()

    def _on_message(self, client, userdata, message) -> None:
        received = Received(message.topic, bytes(message.payload), message.qos, bool(message.retain))
        with self._cond:
            self._messages.append(received)
            self._cond.notify_all()

    def messages(self, topic: str | None = None) -> list[Received]:
        """A snapshot of what arrived, oldest first; only `topic`'s when given."""
        with self._cond:
            return [m for m in self._messages if topic is None or m.topic == topic]

    def payloads(self, topic: str) -> list[object]:
        """The JSON payloads that arrived on `topic` (empty payloads are skipped)."""
        return [m.json() for m in self.messages(topic) if m.payload]

    def wait_for(self, predicate: Callable[[list[Received]], bool], timeout: float = 5.0,
                 topic: str | None = None) -> bool:
        """Wait until `predicate(messages(topic))` is true; False after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                snapshot = [m for m in self._messages if topic is None or m.topic == topic]
                if predicate(snapshot):
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)

    def clear(self) -> None:
        with self._cond:
            self._messages.clear()

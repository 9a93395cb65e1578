"""Logging for the daemon: journald with structured fields under systemd, stderr otherwise.

Under systemd, stderr already ends up in the journal, but as plain text. Writing to the journal
socket ourselves adds fields an operator can filter on (`journalctl -u yoloedge CAMERA=gate`)
and keeps multi-line tracebacks in one entry. The native protocol is simple enough that
systemd-python (which needs libsystemd headers to build) is not worth the dependency.

Every handler carries a `RedactingFilter`: camera and broker URLs hold passwords, and log
lines are read by more people than the config file is. It replaces every secret the configuration
registered (`yoloedge.redact.SECRETS`) and shows every URL in its display form (`redact_text`).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import sys
from typing import Mapping, TextIO

from ..config.schema import LoggingConfig
from ..redact import redact_text
from ..textsafe import printable

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "yoloedge"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
TARGETS = ("auto", "journald", "stderr")

#: log-record attributes (set with `extra=`) that become journal fields and the stderr prefix.
CONTEXT_FIELDS = (("camera", "CAMERA"), ("device", "DEVICE"))


def syslog_priority(levelno: int) -> int:
    """The syslog priority journald expects for a `logging` level (as systemd-python maps it)."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def _context(record: logging.LogRecord) -> list[tuple[str, str]]:
    """(journal field, value) for the camera/device a record was logged for, if any."""
    values = []
    for attribute, field in CONTEXT_FIELDS:
        value = getattr(record, attribute, None)
        if value is not None:
            values.append((field, str(value)))
    return values


class RedactingFilter(logging.Filter):
    """Replaces secrets and URL credentials in the message, traceback and stack text of every record.

    It rewrites the record in place (message pre-formatted, args dropped), so every handler
    after it sees the redacted text, whatever its formatter.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            # A bad format string: leave the record alone so the handler's emit() hits the same
            # error and reports it through logging's own handleError().
            return True
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_text(record.stack_info)
        return True


class StderrFormatter(logging.Formatter):
    """`LEVEL logger: [camera] message`: compact, and greppable by camera or device.

    stderr is often a terminal: control characters in the message, traceback included (a camera's
    error, a file name, a label), are shown escaped (`printable`); only the newlines stay.
    """

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), keep_newlines=True)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        context = " ".join(value for _, value in _context(record))
        prefix = f"[{context}] " if context else ""
        return f"{record.levelname} {record.name}: {prefix}{record.message}"


class StderrHandler(logging.StreamHandler):
    """stderr with `StderrFormatter`; its own class so `setup_logging` can recognise it."""

    def __init__(self, stream: TextIO | None = None) -> None:
        super().__init__(stream if stream is not None else sys.stderr)
        self.setFormatter(StderrFormatter())


def _journal_field(name: str, value: str) -> bytes:
    """One field in the native journal protocol.

    `NAME=value\\n` unless the value has a newline; then the binary form: `NAME\\n`, the length
    as a 64-bit little-endian integer, the bytes, `\\n`.
    """
    data = value.encode("utf-8", "replace")
    key = name.encode("ascii")
    if b"\n" in data:
        return key + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return key + b"=" + data + b"\n"


class JournaldHandler(logging.Handler):
    """Sends each record as one datagram to journald's native socket.

    Fields: MESSAGE (with traceback), PRIORITY, SYSLOG_IDENTIFIER, LOGGER, CODE_FILE, CODE_LINE,
    CODE_FUNC, THREAD_NAME, and CAMERA / DEVICE from the record's `camera` / `device` extras.
    When a send fails (journald restarting, socket missing, message too large) the record goes
    to `fallback` (stderr) instead; the first failure of a streak says so on stderr.
    """

    def __init__(self, socket_path: str = JOURNAL_SOCKET, *, identifier: str = IDENTIFIER,
                 fallback: logging.Handler | None = None) -> None:
        super().__init__()
        self.socket_path = socket_path
        self.identifier = identifier
        self.fallback = fallback if fallback is not None else StderrHandler()
        self._socket: socket.socket | None = None
        self._failing = False

    def encode(self, record: logging.LogRecord) -> bytes:
        """The datagram for `record` (separate from emit() so it can be tested and reused)."""
        fields = [("MESSAGE", self.format(record)),
                  ("PRIORITY", str(syslog_priority(record.levelno))),
                  ("SYSLOG_IDENTIFIER", self.identifier),
                  ("LOGGER", record.name),
                  ("CODE_FILE", record.pathname),
                  ("CODE_LINE", str(record.lineno)),
                  ("CODE_FUNC", record.funcName),
                  ("THREAD_NAME", record.threadName or "")]
        fields.extend(_context(record))
        return b"".join(_journal_field(name, value) for name, value in fields)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            payload = self.encode(record)
        except Exception:  # noqa: BLE001 -- logging's contract: report via handleError, never raise
            self.handleError(record)
            return
        try:
            self._send(payload)
        except OSError as exc:
            self._fall_back(record, exc)
            return
        self._failing = False

    def _send(self, payload: bytes) -> None:
        """Unconnected datagram socket: survives journald restarts without reconnect logic."""
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.sendto(payload, self.socket_path)

    def _fall_back(self, record: logging.LogRecord, exc: OSError) -> None:
        """Never lose a record because journald is unreachable; say why once per outage."""
        if not self._failing:
            self._failing = True
            note = logging.makeLogRecord({
                "name": __name__, "levelno": logging.WARNING, "levelname": "WARNING",
                "msg": "journald socket %s unusable (%s); logging to stderr",
                "args": (self.socket_path, exc)})
            self.fallback.handle(note)
        self.fallback.handle(record)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self.fallback.close()
        super().close()


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except FileNotFoundError:
        return False


def _level(name: str) -> int:
    level = LEVELS.get(name.lower())
    if level is None:
        raise ValueError(f"logging.level must be one of {', '.join(LEVELS)}, got {name!r}")
    return level


def make_handler(target: str, environ: Mapping[str, str], *, journal_socket: str = JOURNAL_SOCKET,
                 stream: TextIO | None = None) -> logging.Handler:
    """The handler for `target`, with redaction installed.

    auto: journald when systemd started us with stderr connected to the journal
    (JOURNAL_STREAM set) and the journal socket exists; stderr otherwise.
    """
    if target not in TARGETS:
        raise ValueError(f"logging.target must be one of {', '.join(TARGETS)}, got {target!r}")
    use_journal = target == "journald" or (
        target == "auto" and "JOURNAL_STREAM" in environ and _is_socket(journal_socket))
    handler: logging.Handler
    if use_journal:
        handler = JournaldHandler(journal_socket, fallback=StderrHandler(stream))
    else:
        handler = StderrHandler(stream)
    handler.addFilter(RedactingFilter())
    return handler


def setup_logging(config: LoggingConfig, environ: Mapping[str, str], *,
                  journal_socket: str = JOURNAL_SOCKET, stream: TextIO | None = None) -> None:
    """Configure the root logger from `config`; safe to call again on reload.

    The daemon owns the root logger: handlers already on it (e.g. from `basicConfig`) are
    removed, so nothing is logged twice; the ones an earlier call installed are also closed.
    """
    level = _level(config.level)
    handler = make_handler(config.target, environ, journal_socket=journal_socket, stream=stream)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, (JournaldHandler, StderrHandler)):
            old.close()
    root.addHandler(handler)
    root.setLevel(level)

"""Where the control socket is when the config file does not say (`control.socket` unset).

Under systemd the unit's RuntimeDirectory makes /run/yoloedge for the service user, so the socket
is /run/yoloedge/control.sock. A normal user who starts the daemon by hand cannot create that
folder, and the daemon would refuse to start; there it uses the per-user runtime folder that the
login manager makes instead: $XDG_RUNTIME_DIR/yoloedge/control.sock. `yoloedge-ctl` looks in the
same two places (`control.location`), so neither needs `control.socket` or `--socket` in the common cases.

Both answers depend only on the environment passed in and on what the file system allows, like
the config loader, which reads ${VAR}s from the `environ` it is given.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

from .schema import ControlConfig

SYSTEM_SOCKET = ControlConfig().socket


def user_socket(environ: Mapping[str, str]) -> str | None:
    """$XDG_RUNTIME_DIR/yoloedge/control.sock, or None where the variable is unset or relative
    (the XDG specification says to ignore a relative one)."""
    runtime = environ.get("XDG_RUNTIME_DIR", "")
    if not runtime.startswith("/"):
        return None
    return os.path.join(runtime, "yoloedge", "control.sock")


def can_create(path: str) -> bool:
    """Whether this process could create `path`: its folder is writable, or the nearest existing
    folder above it is (the daemon makes the missing ones)."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return False
        folder = parent
    return os.access(folder, os.W_OK | os.X_OK)


def daemon_socket(environ: Mapping[str, str], creatable: Callable[[str], bool] = can_create) -> str:
    """The socket a daemon without `control.socket` creates: the system one where this user can
    create it, else the user one; the system one again when there is no $XDG_RUNTIME_DIR (the
    daemon then says why it cannot create it)."""
    fallback = user_socket(environ)
    if fallback is None or creatable(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    return fallback

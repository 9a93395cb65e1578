"""Where `yoloedge-ctl` looks for the control socket when neither `--socket` nor `control.socket`
says: where a daemon would create it (`config.location`, which the loader uses for an unset
`control.socket`), or the one a running daemon of this user already made.

See `config.location` for the two places and why.
"""

from __future__ import annotations

import os
from typing import Callable, Mapping

from ..config.location import SYSTEM_SOCKET, can_create, daemon_socket, user_socket


def client_socket(environ: Mapping[str, str], present: Callable[[str], bool] | None = None,
                  creatable: Callable[[str], bool] = can_create) -> str:
    """The socket `yoloedge-ctl` talks to without --socket or `control.socket`.

    This user's own socket first (a daemon this user started by hand), then the system one; where
    neither is there, the one a daemon started by this user would create, so that "not running"
    names the right path. A system socket this user may not look at counts as there: the operator
    must see "permission denied", not "not running".
    """
    is_present = present or _present
    fallback = user_socket(environ)
    if fallback is not None and is_present(fallback):
        return fallback
    if is_present(SYSTEM_SOCKET):
        return SYSTEM_SOCKET
    return daemon_socket(environ, creatable)


def _present(path: str) -> bool:
    try:
        os.lstat(path)
    except PermissionError:
        return True
    except OSError:
        return False
    return True

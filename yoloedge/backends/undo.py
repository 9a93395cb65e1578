"""The undo stack a device backend keeps: every acquisition pushes its own release.

`close` (and a failed `open`) then release precisely what was acquired, newest first, and a release
that fails does not stop the ones after it: the last Ascend backend's release must still finalise
pyACL, the last TensorRT buffer must still be freed. The failures are collected for the caller,
which raises the first and logs the rest (`raise_collected`).
"""

from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)


class UndoStack:
    def __init__(self) -> None:
        self._steps: list[tuple[str, Callable[[], None]]] = []

    def __bool__(self) -> bool:
        return bool(self._steps)

    def push(self, what: str, undo: Callable[[], None]) -> None:
        """`undo` releases what was just acquired; `what` names it in the log when it fails."""
        self._steps.append((what, undo))

    def unwind(self) -> list[Exception]:
        """Run every step, newest first; a failing one is collected, not allowed to stop the rest."""
        errors: list[Exception] = []
        while self._steps:
            what, undo = self._steps.pop()
            try:
                undo()
            except Exception as exc:  # noqa: BLE001 - collected and raised by the caller
                log.debug("%s failed: %s", what, exc)
                errors.append(exc)
        return errors


def raise_collected(errors: list[Exception], model_path: str) -> None:
    """After a close: raise the first failure, log the others (they would be lost otherwise)."""
    for exc in errors[1:]:
        log.error("also while closing %s: %s", model_path, exc)
    if errors:
        raise errors[0]

"""The next opening's backend, constructed before the current one is released.

Constructing a backend touches no device, but it claims the runtime: one shared by the whole
process and finalised when its last user leaves (pyACL, which can be initialised only once per
process) must stay initialised across the restart of a process's only card. So a device that is
about to be released first reserves the backend its next opening will use (see `worker`).
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ..backends.base import Backend

log = logging.getLogger(__name__)


class SpareBackend:
    """At most one constructed, unopened backend of one device. Its lock is a leaf, never held
    while a backend is constructed or closed (status must not wait for either)."""

    def __init__(self, name: str, factory: Callable[[], Backend], stopping: threading.Event):
        self._name = name
        self._factory = factory
        self._stopping = stopping
        self._lock = threading.Lock()
        self._spare: Backend | None = None

    def reserve(self) -> None:
        """Construct the backend of the next opening now, while this one still holds the runtime."""
        with self._lock:
            if self._spare is not None or self._stopping.is_set():
                return
        try:
            spare = self._factory()
        except Exception:  # noqa: BLE001 - the next opening constructs it (and reports why not)
            log.exception("%s: cannot prepare the backend for the next opening", self._name)
            return
        with self._lock:
            kept = self._spare is None and not self._stopping.is_set()
            if kept:
                self._spare = spare
        if not kept:  # someone else reserved one, or we are stopping
            self._close(spare)

    def take(self) -> Backend:
        """The reserved backend, or a new one."""
        with self._lock:
            spare, self._spare = self._spare, None
        return spare if spare is not None else self._factory()

    def discard(self) -> None:
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None:
            self._close(spare)

    def _close(self, spare: Backend) -> None:
        try:
            spare.close()  # never opened: releases only its claim on the runtime
        except Exception:  # noqa: BLE001 - logged; stopping goes on
            log.exception("%s: error while discarding the unused backend", self._name)

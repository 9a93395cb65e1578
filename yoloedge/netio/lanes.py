"""Handler lanes: the threads that turn a parsed request into its reply, bounded per lane.

Only a complete, parsed request costs a thread, and at most `LaneLimit.running` of a lane's run
at once; more wait in line (at most `LaneLimit.waiting`, None for no bound besides the
connections), and the server answers "busy" to those its lane cannot take. Lanes are separate so
that requests that may wait long (a reload) cannot take the slots of quick ones (status).

Threads: the I/O thread calls everything here but `_run`. A handler thread runs one job, puts the
job's completion on a queue and pokes the I/O thread, which runs the completion (writing the
reply) in `collect`; nothing is shared besides that queue, so there is no lock.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Hashable, Mapping

from .connection import Completion, Connection, Job, Phase

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LaneLimit:
    running: int
    waiting: int | None = None  # None: as many as there are connections


class HandlerLanes:
    """Jobs per lane (see the module docstring); `name` names the threads, `what` the server in
    the log. `deadline_covers_handler`: whether a connection's deadline keeps running while its
    handler computes (else it is lifted until the reply)."""

    def __init__(self, name: str, what: str, limits: Mapping[Hashable, LaneLimit], poke: Callable[[], None],
                 deadline_covers_handler: bool) -> None:
        self._name, self._what = name, what
        self._limits = dict(limits)
        self._poke = poke
        self._deadline_covers_handler = deadline_covers_handler
        self._results: queue.SimpleQueue[tuple[Connection, Completion | None]] = queue.SimpleQueue()
        self._running = dict.fromkeys(self._limits, 0)
        self._waiting = {lane: collections.deque[Connection]() for lane in self._limits}

    def waiting(self, lane: Hashable) -> int:
        return len(self._waiting[lane])

    def submit(self, conn: Connection, job: Job) -> bool:
        """Run `job` for `conn` in `conn.lane`, now or when a slot is free; False when the lane's
        line is full (nothing was taken: the caller answers "busy")."""
        lane, limit = conn.lane, self._limits[conn.lane]
        if self._running[lane] < limit.running:
            self._start(conn, job)
            return True
        waiting = self._waiting[lane]
        if limit.waiting is not None and len(waiting) >= limit.waiting:
            return False
        conn.phase, conn.job = Phase.QUEUED, job
        waiting.append(conn)
        return True

    def withdraw(self, conn: Connection) -> bool:
        """Take a waiting connection out of its line (it expired or closed); False if not waiting."""
        waiting = self._waiting.get(conn.lane)
        if waiting is None or conn not in waiting:
            return False
        waiting.remove(conn)
        conn.job = None
        return True

    def collect(self, complete: Callable[[Connection, Completion | None], None]) -> None:
        """Run the completions handed back so far (`complete`, for open connections only), each
        freeing its slot for the next one waiting in its lane."""
        while True:
            try:
                conn, completion = self._results.get_nowait()
            except queue.Empty:
                return
            lane = conn.lane  # a next request on this connection may take another
            self._running[lane] -= 1
            if not conn.closed:
                complete(conn, completion)
            self._start_waiting(lane)

    def _start_waiting(self, lane: Hashable) -> None:
        waiting = self._waiting[lane]
        while waiting and self._running[lane] < self._limits[lane].running:
            conn = waiting.popleft()
            job, conn.job = conn.job, None
            if not conn.closed and conn.phase is Phase.QUEUED and job is not None:
                self._start(conn, job)

    def _start(self, conn: Connection, job: Job) -> None:
        self._running[conn.lane] += 1
        conn.phase = Phase.HANDLING
        if not self._deadline_covers_handler:
            conn.deadline = None
        threading.Thread(target=self._run, args=(conn, job), name=f"{self._name}-handler", daemon=True).start()

    def _run(self, conn: Connection, job: Job) -> None:
        """Handler thread: run the job and hand its completion to the I/O thread, whatever happens."""
        completion: Completion | None = None
        try:
            completion = job()
        except Exception:  # noqa: BLE001 -- logged; the connection is closed, the server goes on
            log.exception("%s: a request handler failed", self._what)
        finally:
            self._results.put((conn, completion))
            self._poke()

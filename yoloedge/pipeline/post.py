"""Post-processing: decode + NMS off the device threads, then publishing, in order.

One stage per accelerator group. Workers `submit()` output sets as their runs finish; the stage
decodes them on a small pool of threads that grows (up to `max_threads`) whenever a batch arrives
and no thread is free, so one slow decode never holds the device up. Publishing, however, follows
the batches' tickets (the order they were sealed in, see `batcher`): a decoded batch waits in
`_ready` until every earlier ticket is published or given up (`skip()`), and then whichever
thread completes the sequence publishes it. So each camera's frames are published in the order
they were read, while decoding runs in parallel, and no thread ever blocks waiting for its turn.

Each output set brings the model's description (`modelinfo.ModelInfo`: the decoder, the labels),
the same for every device of the group. It goes back to its device once its frames are
published: a slow broker or a slow decode therefore slows the device down (bounded memory)
instead of queueing without end.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from typing import Callable

from ..postprocess import Detections
from ..threads import lower_priority
from .slots import OutputSet, SlotMeta

log = logging.getLogger(__name__)

#: sink(meta, detections, output_set): filters, stages, sinks (see `results.ResultRouter`)
Sink = Callable[[SlotMeta, Detections, OutputSet], None]
_Decoded = tuple[OutputSet | None, list[Detections | None]]
#: floor(camera): the lowest score to keep for that camera's frames (a tracker's low score, see
#: `results.ResultRouter.floor`), None for the model's own thresholds
Floor = Callable[[str], "float | None"]


def no_floor(camera: str) -> float | None:
    return None


class PostStage:
    def __init__(self, name: str, sink: Sink, max_threads: int = 1, floor: Floor = no_floor):
        self.name = name
        self.sink = sink
        self.floor = floor
        self.max_threads = max(1, max_threads)
        self.errors = 0
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._heap: list[tuple[int, int, OutputSet | None]] = []  # (ticket, arrival, item); None: skipped
        self._arrivals = itertools.count()
        self._ready: dict[int, _Decoded] = {}
        self._next_ticket = 0
        self._publishing = False
        self._decoding = 0
        self._idle = 0
        self._threads: list[threading.Thread] = []
        self._stopping = False

    # -- producers (device workers) ----------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            self._spawn()

    def submit(self, output_set: OutputSet) -> None:
        self._push(output_set.ticket, output_set)

    def skip(self, ticket: int) -> None:
        """Ticket `ticket` will never be submitted (its batch failed or was dropped)."""
        if ticket >= 0:
            self._push(ticket, None)

    def _push(self, ticket: int, item: OutputSet | None) -> None:
        with self._lock:
            entry = (ticket, next(self._arrivals), item)
            heapq.heappush(self._heap, entry)
            if self._idle == 0 and len(self._threads) < self.max_threads and not self._stopping:
                try:
                    self._spawn()
                except RuntimeError:  # no decoder at all: the caller gives the batch up, so unqueue it
                    self._heap.remove(entry)
                    heapq.heapify(self._heap)
                    raise
            self._work.notify()

    def _spawn(self) -> None:
        """One more decoder. When the process is out of threads, the item already queued waits for
        a running decoder; only a pool with none at all has to fail the batch (the caller's error)."""
        thread = threading.Thread(target=self._serve, name=f"post-{self.name}-{len(self._threads)}", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:
            if not self._threads:
                raise
            log.warning("post-processing %s: cannot add a thread (%s); %d keep decoding",
                        self.name, exc, len(self._threads))
            return
        self._threads.append(thread)

    # -- the pool ----------------------------------------------------------------------------
    def _serve(self) -> None:
        lower_priority()  # host work: the device worker comes first (see yoloedge.threads)
        while True:
            with self._lock:
                while not self._heap and not self._stopping:
                    self._idle += 1
                    self._work.wait()
                    self._idle -= 1
                if not self._heap:
                    return
                ticket, _, item = heapq.heappop(self._heap)
                self._decoding += 1
            decoded = self._decode(item) if item is not None else []
            with self._lock:
                self._decoding -= 1
                self._ready[ticket] = (item, decoded)
                if self._publishing:
                    continue  # the thread publishing now will reach it
                self._publishing = True
            self._publish_in_order()

    def _decode(self, item: OutputSet) -> list[Detections | None]:
        postprocess = item.model.postprocess
        results: list[Detections | None] = []
        for i in range(item.count):
            meta = item.metas[i]
            geometry = meta.geometry
            if geometry is None:  # the letterbox failed: the slot holds no frame
                results.append(None)
                continue
            try:
                results.append(postprocess([o[i] for o in item.outputs], geometry, self.floor(meta.camera)))
            except Exception:  # noqa: BLE001 - one bad output must not stop the rest
                self.errors += 1
                results.append(None)
                log.exception("post-processing frame %d of %s failed", meta.seq, meta.camera,
                              extra={"camera": meta.camera})
        return results

    def _publish_in_order(self) -> None:
        """Publish every decoded batch whose turn has come; only one thread does this at a time."""
        while True:
            with self._lock:
                entry = self._ready.pop(self._next_ticket, None)
                if entry is None:
                    self._publishing = False
                    return
                self._next_ticket += 1
            item, decoded = entry
            if item is None:
                continue
            try:
                self._publish(item, decoded)
            finally:
                item.release()

    def _publish(self, item: OutputSet, decoded: list[Detections | None]) -> None:
        for meta, dets in zip(item.metas, decoded):
            if dets is None:
                continue
            try:
                self.sink(meta, dets, item)
            except Exception:  # noqa: BLE001 - one frame's publishing error must not stop the rest
                self.errors += 1
                log.exception("publishing frame %d of %s failed", meta.seq, meta.camera,
                              extra={"camera": meta.camera})

    # -- state -------------------------------------------------------------------------------
    def pending(self) -> int:
        """Batches submitted and not yet published."""
        with self._lock:
            return len(self._heap) + self._decoding + len(self._ready)

    @property
    def threads(self) -> int:
        return len(self._threads)

    @property
    def stopped(self) -> bool:
        return self._stopping and not any(t.is_alive() for t in self._threads)

    def stop(self, timeout: float) -> bool:
        """Finish what is queued (bounded by `timeout`), then let the threads end."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
        for thread in list(self._threads):
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads)

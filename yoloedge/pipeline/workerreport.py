"""A device worker's report for status, `yoloedge-ctl` and /metrics: its state, meters, errors
and, per model, whether it runs, the batches it ran and the memory its buffers take.

Read on the status threads without the worker's lock: every value is one read of something its
own thread writes (status must never wait for a device call or the supervisor).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .served import LoadedModel
    from .worker import DeviceWorker


def worker_report(worker: DeviceWorker) -> dict:
    inc = worker.incarnation
    alive = inc is not None and not inc.done.is_set()
    detector = inc.detector if inc is not None and alive else None
    loaded = inc.models if inc is not None and alive else []
    retry = worker.next_retry_mono
    stats = worker.stats
    return {
        "name": worker.worker_name,
        "backend": worker.accelerator.backend,
        "device": worker.device,
        "model": worker.served[0].model.path,
        "models": models_report(worker, loaded),
        "batch": detector.max_batch if detector else worker.accelerator.batch,
        "state": worker.state.value,
        **stats.meters(),
        "queue_depth": sum(m.batcher.pending() for m in worker.served),
        "in_flight": worker.in_flight,  # a batch is on the device now
        "errors": stats.errors,
        "frames_lost": stats.frames_lost,
        "rebalanced": sum(m.batcher.rebalanced_to(worker.worker_name) for m in worker.served),
        "restarts": stats.restarts,
        "last_error": worker.last_error,
        "next_retry_in_s": None if retry is None else round(max(0.0, retry - worker.clock()), 1),
        "hung_calls": worker.hung_calls,
        "leaked_openings": stats.leaked_openings,
        "description": detector.backend.description if detector else "",
        "error": worker.startup_error,
        "telemetry": detector.backend.telemetry() if detector else None,
        "runtime": detector.backend.runtime_info() if detector else None,
    }


def runtime_problems(worker: DeviceWorker) -> list[str]:
    """What the backends of the running models found wrong with their runtime at open (an .om
    converted for another chip), once per distinct text."""
    inc = worker.incarnation
    if inc is None or inc.done.is_set():
        return []
    found: list[str] = []
    for model in inc.models:
        info = model.detector.backend.runtime_info() or {}
        found += [p for p in info.get("problems") or () if p not in found]
    return found


def models_report(worker: DeviceWorker, loaded: Sequence[LoadedModel]) -> list[dict]:
    """Per model: loaded or why not, the batches this opening ran of it, its memory."""
    by_name = {m.name: m for m in loaded}
    rows = []
    for served in worker.served:
        model = by_name.get(served.name)
        error = worker.failed_models.get(served.name)
        rows.append({
            "name": served.name,
            "path": served.model.path,
            "state": "running" if model is not None else ("failed" if error else "not loaded"),
            "error": error,
            "batches": model.batches if model is not None else 0,
            "memory": model.detector.backend.memory() if model is not None else None,
            "runtime": model.detector.backend.runtime_info() if model is not None else None,
        })
    return rows

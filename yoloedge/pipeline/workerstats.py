"""What a device worker has done, for status and /metrics: its meters and counters, apart from
the supervisor that decides what the device does next.

Written by the device's threads (its current incarnation, an abandoned one's late return, the
supervisor giving frames up); read without a lock by status and scrapes, like the camera's
`CameraRuntime` meters: each field is one number or one meter with its own lock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..backends.base import BatchTiming
from ..metrics import BucketCounts, LatencyWindow, RateMeter

#: device call bounds (s) of the `yoloedge_inference_seconds` histogram (web.metrics).
INFERENCE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5)
#: the steps of a batch a backend may time apart (`Backend.last_timing`), as status and /metrics name them
STEPS = ("copy_in", "execute", "copy_out")


@dataclass
class StepMeters:
    """One step of the batches (copy-in, execute, copy-out): a window for status, buckets for /metrics."""

    buckets: BucketCounts = field(default_factory=lambda: BucketCounts(INFERENCE_BUCKETS_S))
    ms: LatencyWindow = field(default_factory=LatencyWindow)

    def add(self, seconds: float) -> None:
        self.ms.add(seconds * 1000)
        self.buckets.add(seconds)


@dataclass
class WorkerStats:
    inferences: RateMeter
    frames_done: RateMeter
    #: device seconds per second: the device's utilisation; its total is the busy time so far
    busy: RateMeter
    #: for /metrics: cumulative, where the windows below forget
    batch_buckets: BucketCounts
    infer_buckets: BucketCounts = field(default_factory=lambda: BucketCounts(INFERENCE_BUCKETS_S))
    infer_ms: LatencyWindow = field(default_factory=LatencyWindow)
    batch_sizes: LatencyWindow = field(default_factory=LatencyWindow)
    errors: int = 0  # inferences that failed
    consecutive_errors: int = 0  # ... in a row, since the last success or (re)opening
    frames_lost: int = 0  # frames that will not be published (failed, hung or dropped batches)
    restarts: int = 0  # times the device was opened again
    leaked_openings: int = 0  # incarnations left open because their memory might still be in use
    #: per step, from the backends that time them apart (empty meters otherwise)
    steps: dict[str, StepMeters] = field(default_factory=lambda: {step: StepMeters() for step in STEPS})

    @classmethod
    def for_batch(cls, batch: int, clock: Callable[[], float] = time.monotonic) -> WorkerStats:
        return cls(inferences=RateMeter(clock=clock), frames_done=RateMeter(clock=clock),
                   busy=RateMeter(clock=clock), batch_buckets=BucketCounts(batch_bounds(batch)))

    def inferred(self, frames: int, seconds: float, timing: BatchTiming | None = None) -> None:
        """One batch of `frames` ran in `seconds` of device time, split as `timing` says where the
        backend measured that (a step it could not tell apart, None, is not counted)."""
        if timing is not None:
            for step, value in zip(STEPS, (timing.copy_in_s, timing.execute_s, timing.copy_out_s)):
                if value is not None:
                    self.steps[step].add(value)
        self.busy.mark(seconds)
        self.infer_ms.add(seconds * 1000)
        self.batch_sizes.add(frames)
        self.infer_buckets.add(seconds)
        self.batch_buckets.add(frames)
        self.inferences.mark()
        self.frames_done.mark(frames)


    def meters(self) -> dict:
        """The status report's rates and percentiles."""
        return {
            "inferences_per_s": round(self.inferences.rate(), 2),
            "frames_per_s": round(self.frames_done.rate(), 2),
            "utilisation": round(min(1.0, self.busy.rate()), 3),
            "busy_s": round(self.busy.total, 3),
            "p50_ms": self.infer_ms.percentile(50),
            "p99_ms": self.infer_ms.percentile(99),
            "batch_p50": self.batch_sizes.percentile(50),
            **{f"{step}_p50_ms": meters.ms.percentile(50) for step, meters in self.steps.items()},
        }


def batch_bounds(batch: int) -> tuple[float, ...]:
    """1, 2, 4... up to the configured batch, which is a bound itself: a full batch is its own bucket."""
    return tuple(sorted({float(2 ** i) for i in range(batch.bit_length()) if 2 ** i < batch} | {float(batch)}))

"""A camera as the daemon runs it: its reader, its queue and what it has published."""

from __future__ import annotations

from ..config.schema import CameraConfig
from ..sources.reader import CameraReader
from .metrics import LatencyWindow, RateMeter
from .queues import FrameQueue

#: A file processed losslessly keeps this many frames per batch slot ready, so a batch can fill.
LOSSLESS_DEPTH_PER_BATCH = 2


def is_lossless(config: CameraConfig) -> bool:
    return config.realtime is False


class CameraRuntime:
    def __init__(self, config: CameraConfig, group: str, queue: FrameQueue | None,
                 reader: CameraReader | None):
        self.config = config
        self.group = group
        self.queue = queue
        self.reader = reader
        self.latency_ms = LatencyWindow()
        # capture -> taken into a batch -> inferred -> published, per stage
        self.stage_ms = {"queue": LatencyWindow(), "inference": LatencyWindow(), "publish": LatencyWindow()}
        self.published = RateMeter()
        self.published_frames = 0
        self.publish_failures = 0

    @property
    def name(self) -> str:
        return self.config.name

    def start(self) -> None:
        if self.reader is not None:
            self.reader.start()

    def stop(self) -> None:
        if self.reader is not None:
            self.reader.stop()

    def join(self, timeout: float) -> bool:
        if self.reader is None:
            return True
        self.reader.join(timeout)
        return not self.reader.is_alive()

    def record_latency(self, timings: dict[str, float], capture_mono: float, published_mono: float) -> float:
        total = (published_mono - capture_mono) * 1000
        self.latency_ms.add(total)
        batched = timings.get("batched", capture_mono)
        inferred = timings.get("inferred", batched)
        self.stage_ms["queue"].add((batched - capture_mono) * 1000)
        self.stage_ms["inference"].add((inferred - batched) * 1000)
        self.stage_ms["publish"].add((published_mono - inferred) * 1000)
        return total

    def open_captures(self) -> int:
        """Capture threads still inside OpenCV (a frozen camera's read ends at its timeout)."""
        return self.reader.open_captures() if self.reader is not None else 0

    def status(self) -> dict:
        stats = self.reader.stats() if self.reader is not None else {"state": "disabled"}
        return {
            "name": self.name,
            "url": stats.get("url"),
            "accelerator": self.group,
            "state": str(stats.get("state")),
            "fps_in": stats.get("fps_in"),
            "fps_out": round(self.published.rate(), 2),
            "frames_in": stats.get("frames_in"),
            "published": self.published_frames,
            "drops": (stats.get("queue_drops") or 0),
            "sampled_out": stats.get("sampled_out"),
            "reconnects": stats.get("reconnects"),
            "stalls": stats.get("stalls"),
            "last_frame_age_s": stats.get("last_frame_age_s"),
            "latency_p50_ms": self.latency_ms.percentile(50),
            "latency_p99_ms": self.latency_ms.percentile(99),
            "stage_p50_ms": {name: w.percentile(50) for name, w in self.stage_ms.items()},
            "publish_failures": self.publish_failures,
            "error": stats.get("error"),
        }

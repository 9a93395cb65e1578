"""A camera as the daemon runs it: its reader, its queue and what it has published."""

from __future__ import annotations

from ..config.schema import CameraConfig
from ..metrics import LatencyWindow, RateMeter
from ..sources.reader import CameraReader
from ..sources.state import CameraState
from .queues import FrameQueue
from .slots import SlotMeta

#: A file processed losslessly keeps this many frames per batch slot ready, so a batch can fill.
LOSSLESS_DEPTH_PER_BATCH = 2
STAGES = ("queue", "batch", "inference", "publish")


def is_lossless(config: CameraConfig) -> bool:
    return config.realtime is False


def queue_size_for(config: CameraConfig, batch: int) -> int:
    """A lossless file keeps enough frames queued to fill a batch; a live camera its `queue_size`."""
    if is_lossless(config):
        return max(config.queue_size, LOSSLESS_DEPTH_PER_BATCH * batch)
    return config.queue_size


class CameraRuntime:
    def __init__(self, config: CameraConfig, group: str, queue: FrameQueue | None,
                 reader: CameraReader | None, failed: str | None = None):
        self.config = config
        self.failed = failed  # why the camera could not be started at all (its accelerator failed)
        self.group = group
        self.queue = queue
        self.reader = reader
        self.classes = frozenset(config.classes) if config.classes is not None else None
        self.latency_ms = LatencyWindow()
        self.stage_ms = {name: LatencyWindow() for name in STAGES}
        self.published = RateMeter()
        self.published_frames = 0
        self.publish_failures = 0
        self.filtered_out = 0  # frames whose detections were all filtered away (publish_empty: false)

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

    def record_published(self, meta: SlotMeta, started: float, inferred: float, published: float) -> None:
        self.published_frames += 1
        self.published.mark()
        self.latency_ms.add((published - meta.capture_mono) * 1000)
        stages = self.stage_ms
        stages["queue"].add((meta.taken_mono - meta.capture_mono) * 1000)
        stages["batch"].add((started - meta.taken_mono) * 1000)
        stages["inference"].add((inferred - started) * 1000)
        stages["publish"].add((published - inferred) * 1000)

    def open_captures(self) -> int:
        """Capture threads still inside OpenCV (a frozen camera's read ends at its timeout)."""
        return self.reader.open_captures() if self.reader is not None else 0

    @property
    def state(self) -> CameraState:
        if self.reader is not None:
            return self.reader.state
        return CameraState.FAILED if self.failed else CameraState.DISABLED

    def status(self) -> dict:
        stats = self.reader.stats() if self.reader is not None else {"state": self.state.value,
                                                                     "error": self.failed}
        return {
            "name": self.name,
            "url": stats.get("url"),
            "accelerator": self.group,
            "state": str(stats.get("state")),
            "fps_in": stats.get("fps_in"),
            "fps_out": round(self.published.rate(), 2),
            "frames_in": stats.get("frames_in"),
            "published": self.published_frames,
            "drops": self.queue.dropped if self.queue is not None else 0,
            "sampled_out": stats.get("sampled_out"),
            "filtered_out": self.filtered_out,
            "reconnects": stats.get("reconnects"),
            "stalls": stats.get("stalls"),
            "images_skipped": stats.get("images_skipped"),
            "jpeg_decoder": stats.get("jpeg_decoder"),
            "decoder": stats.get("decoder"),
            "last_frame_age_s": stats.get("last_frame_age_s"),
            "latency_p50_ms": self.latency_ms.percentile(50),
            "latency_p99_ms": self.latency_ms.percentile(99),
            "stage_p50_ms": {name: w.percentile(50) for name, w in self.stage_ms.items()},
            "publish_failures": self.publish_failures,
            "error": stats.get("error"),
        }

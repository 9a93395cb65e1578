"""A camera as the daemon runs it: its reader, its queue and what it has published."""

from __future__ import annotations

import threading
import time
from typing import Sequence

import numpy as np

from ..config.schema import CameraConfig
from ..postprocess import label_of
from ..metrics import BucketCounts, LatencyWindow, RateMeter
from ..sources.reader import CameraReader
from ..sources.state import CameraState
from .feed import CameraFeed

#: A file processed losslessly keeps this many frames per batch slot ready, so a batch can fill.
LOSSLESS_DEPTH_PER_BATCH = 2
STAGES = ("queue", "batch", "inference", "publish")
#: capture -> published bounds (s) of the `yoloedge_frame_latency_seconds` histogram.
LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)


def is_lossless(config: CameraConfig) -> bool:
    return config.realtime is False


def queue_size_for(config: CameraConfig, batch: int) -> int:
    """A lossless file keeps enough frames queued to fill a batch; a live camera its `queue_size`."""
    if is_lossless(config):
        return max(config.queue_size, LOSSLESS_DEPTH_PER_BATCH * batch)
    return config.queue_size


class CameraRuntime:
    def __init__(self, config: CameraConfig, group: str, feed: CameraFeed | None,
                 reader: CameraReader | None, failed: str | None = None, models: Sequence[str] = ()):
        self.config = config
        #: the names of the models its frames go to, in `models:` order
        self.models = tuple(models)
        self.failed = failed  # why the camera could not be started at all (its accelerator failed)
        #: model name -> why this camera's frames do not go to it (it failed to load on every device)
        self.model_errors: dict[str, str] = {}
        self.group = group
        #: the reader's way into the pipeline: per model its queue and picture ring
        self.feed = feed
        self.reader = reader
        self.classes = frozenset(config.classes) if config.classes is not None else None
        self.latency_ms = LatencyWindow()
        self.stage_ms = {name: LatencyWindow() for name in STAGES}
        self.published = RateMeter()
        self.published_frames = 0  # results: a frame fed to two models is published twice
        self._published_by_model: dict[str, int] = {}
        self._frames_lock = threading.Lock()  # models' post threads record a camera's frames at once
        self.publish_failures = 0
        self.filtered_out = 0  # frames whose detections were all filtered away (publish_empty: false)
        self.started_mono: float | None = None  # when start() began the first connection
        #: for /metrics (web.metrics): cumulative, where the windows above forget
        self.latency_buckets = BucketCounts(LATENCY_BUCKETS_S)
        self._detections: dict[tuple[str, str], int] = {}  # (model, label) -> detections published
        self._detections_lock = threading.Lock()  # a scrape copies the dict while frames add labels

    @property
    def name(self) -> str:
        return self.config.name

    def start(self, now: float | None = None) -> None:
        if self.reader is not None:
            self.started_mono = time.monotonic() if now is None else now
            self.reader.start()

    def first_connection(self, now: float) -> bool:
        """Still connecting for the first time, within the camera's open_timeout_s: not yet a
        problem. Without this grace every start-up (and every camera added by a reload) reported
        the daemon unhealthy, with no other reason, until the first frame arrived."""
        return (self.state is CameraState.CONNECTING and self.started_mono is not None
                and now - self.started_mono < self.config.open_timeout_s)

    def stop(self) -> None:
        if self.reader is not None:
            self.reader.stop()

    def join(self, timeout: float) -> bool:
        if self.reader is None:
            return True
        self.reader.join(timeout)
        return not self.reader.is_alive()

    def close(self) -> None:
        """Removed (stopped, its queue closed): free its pictures now (see `CameraIntake.close`)."""
        if self.feed is not None:
            self.feed.close()

    def record_frame(self, captured: float, taken: float, started: float, inferred: float,
                     published: float, model: str = "") -> None:
        """One frame of one model handed to the sinks (monotonic times of its stages, see
        `routing.router`)."""
        with self._frames_lock:
            self.published_frames += 1
            self._published_by_model[model] = self._published_by_model.get(model, 0) + 1
            self.published.mark()
            self.latency_ms.add((published - captured) * 1000)
            self.latency_buckets.add(published - captured)
            stages = self.stage_ms
            stages["queue"].add((taken - captured) * 1000)
            stages["batch"].add((started - taken) * 1000)
            stages["inference"].add((inferred - started) * 1000)
            stages["publish"].add((published - inferred) * 1000)

    def count_labels(self, class_ids: np.ndarray, labels: Sequence[str], model: str = "") -> None:
        """One frame's detections as published, per model and label (the label the message gives,
        so /metrics and MQTT agree by construction)."""
        if not len(class_ids):
            return
        with self._detections_lock:
            for cid in class_ids.tolist():
                key = (model, label_of(labels, cid))
                self._detections[key] = self._detections.get(key, 0) + 1

    def detections_by_label(self) -> dict[tuple[str, str], int]:
        """(model, label) -> detections published."""
        with self._detections_lock:
            return dict(self._detections)

    def models_status(self) -> dict[str, dict]:
        """Per model this camera is configured for: its queue, drops and frames published, or why
        the camera's frames do not go to it."""
        queues = self.feed.queues if self.feed is not None else {}
        with self._frames_lock:
            published = dict(self._published_by_model)
        rows: dict[str, dict] = {}
        for name in (*self.models, *(m for m in self.model_errors if m not in self.models)):
            queue = queues.get(name)
            rows[name] = {"published": published.get(name, 0),
                          "queued": len(queue) if queue is not None else 0,
                          "drops": queue.dropped if queue is not None else 0,
                          "error": self.model_errors.get(name)}
        return rows

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
            "drops": self.feed.dropped if self.feed is not None else 0,
            "models": self.models_status(),
            "sampled_out": stats.get("sampled_out"),
            "filtered_out": self.filtered_out,
            "reconnects": stats.get("reconnects"),
            "stalls": stats.get("stalls"),
            "images_skipped": stats.get("images_skipped"),
            "jpeg_decoder": stats.get("jpeg_decoder"),
            "decoder": stats.get("decoder"),
            "decoder_reason": stats.get("decoder_reason"),
            "frame_size": stats.get("frame_size"),
            "size_changes": stats.get("size_changes"),
            "last_frame_age_s": stats.get("last_frame_age_s"),
            "latency_p50_ms": self.latency_ms.percentile(50),
            "latency_p99_ms": self.latency_ms.percentile(99),
            "stage_p50_ms": {name: w.percentile(50) for name, w in self.stage_ms.items()},
            "publish_failures": self.publish_failures,
            "error": stats.get("error"),
            "last_error": stats.get("last_error"),
            "last_error_at": stats.get("last_error_at"),
        }

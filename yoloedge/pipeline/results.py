"""The result path: one frame's detections -> the camera's filters -> its MQTT message -> published.

Called by post-processing, in each camera's frame order (see `post`). Also records what status
shows per camera: frames published, rate, capture -> publish latency and where it went:

    queue      captured -> taken from the camera's queue for letterboxing
    batch      taken -> its batch started on the device (letterbox, waiting for the batch/device)
    inference  the device call
    publish    device done -> handed to the MQTT client (decode, NMS, filters, message)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping

from ..postprocess import Detections
from ..publish.messages import camera_state_message, detection_message, filter_detections
from ..publish.mqtt import MqttPublisher
from ..sources.state import CameraState
from .cameras import CameraRuntime
from .slots import OutputSet, SlotMeta
from .snapshots import SnapshotStore


class ResultPublisher:
    def __init__(self, cameras: Mapping[str, CameraRuntime], publisher: Callable[[], MqttPublisher | None],
                 model_path: str, clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, snapshots: SnapshotStore | None = None,
                 watch: Callable[[str, dict], None] | None = None):
        self._cameras = cameras
        self._publisher = publisher  # the current one: a reload may replace it
        self._model = Path(model_path).name
        self._clock = clock
        self._wall_clock = wall_clock
        self._snapshots = snapshots  # keeps each camera's latest frame with what was published for it
        self._watch = watch  # `yoloedge-ctl watch`: every detection message that went out

    def __call__(self, meta: SlotMeta, dets: Detections, output_set: OutputSet) -> None:
        runtime = self._cameras.get(meta.camera)
        publisher = self._publisher()
        if runtime is None or publisher is None:  # removed by a reload while its frames were in flight
            return
        camera = runtime.config
        labels = output_set.worker.loaded.labels
        dets = filter_detections(dets, labels, runtime.classes, camera.min_score)
        if self._snapshots is not None:
            self._snapshots.published(meta.camera, meta.seq, meta.capture_mono, meta.capture_time, dets, labels)
        if not len(dets) and not camera.publish_empty:
            runtime.filtered_out += 1
            return
        now = self._clock()
        message = detection_message(meta.camera, meta.seq, meta.capture_time, dets, labels, self._model,
                                    (now - meta.capture_mono) * 1000)
        if publisher.publish_detections(meta.camera, message):
            runtime.record_published(meta, output_set.started_mono, output_set.inferred_mono, now)
            runtime.count_detections(message["detections"])
            if self._watch is not None:
                self._watch(meta.camera, message)
        else:
            runtime.publish_failures += 1

    def camera_state(self, camera: str, state: CameraState, reason: str | None) -> None:
        """A reader's state change -> the camera's retained `state` topic."""
        publisher = self._publisher()
        if publisher is not None:
            publisher.publish_camera_state(
                camera, camera_state_message(camera, str(state), reason, self._wall_clock()))

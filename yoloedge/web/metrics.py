"""`GET /metrics`: the daemon's status, in Prometheus' text format, read at scrape time.

A custom collector rather than prometheus_client's Counter/Gauge objects: the pipeline already
counts everything (status shows it), so a scrape reads the same status snapshot whose `as_dict()`
`yoloedge-ctl status --json` prints (`daemon.status.DaemonStatus`, by attribute), plus the
cumulative histogram buckets the pipeline keeps beside its percentile windows
(`metrics.BucketCounts`). A frame costs nothing extra for the exporter, and
/metrics and status cannot disagree about a count.

One registry per daemon (`new_registry`), not prometheus_client's global one: a process may run
more than one daemon (tests do), and the global registry would refuse a second collector.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ..metrics import BucketCounts

if TYPE_CHECKING:
    from ..daemon.status import CameraStatus, DaemonStatus, WorkerStatus
    from ..pipeline.cameras import CameraRuntime
    from ..pipeline.worker import DeviceWorker


class Meters(NamedTuple):
    """What the collector reads, taken once per scrape: the daemon's status snapshot, and the
    pipeline's own meter objects for what status has no room for (histograms, labels)."""

    status: DaemonStatus
    cameras: list[CameraRuntime]
    workers: list[tuple[str, DeviceWorker]]  # (accelerator name, worker)


CAMERA_LABELS = ("camera", "accelerator")
DEVICE_LABELS = ("accelerator", "device")

#: (metric name, help, the status' count) of the per-camera counters
CAMERA_COUNTERS: tuple[tuple[str, str, Callable[[CameraStatus], int]], ...] = (
    ("yoloedge_camera_frames_in_total", "Frames decoded from the camera.", lambda cam: cam.frames_in),
    ("yoloedge_camera_frames_published_total", "Frames whose detections were published.",
     lambda cam: cam.published),
    ("yoloedge_camera_frames_dropped_total", "Frames dropped because the accelerator was busy "
                                             "(live cameras keep the latest).", lambda cam: cam.drops),
    ("yoloedge_camera_reconnects_total", "Times the camera was connected again.", lambda cam: cam.reconnects),
)


class DaemonCollector(Collector):
    def __init__(self, meters: Callable[[], Meters]):
        self._meters = meters

    def collect(self) -> Iterator[Metric]:
        meters = self._meters()
        status = meters.status
        yield from camera_metrics(status.cameras, meters.cameras)
        yield from count_metrics(status.cameras)
        yield from sink_metrics(status.sinks or {})
        yield from device_metrics(status.accelerators, meters.workers)
        yield from mqtt_metrics(status.mqtt or {})


def camera_metrics(cameras: list[CameraStatus], runtimes: list[CameraRuntime]) -> Iterator[Metric]:
    for name, doc, value in CAMERA_COUNTERS:
        family = CounterMetricFamily(name, doc, labels=CAMERA_LABELS)
        for cam in cameras:
            family.add_metric((cam.name, cam.accelerator), value(cam))
        yield family
    up = GaugeMetricFamily("yoloedge_camera_up", "1 while the camera is streaming.", labels=CAMERA_LABELS)
    for cam in cameras:
        up.add_metric((cam.name, cam.accelerator), 1 if cam.streaming else 0)
    yield up
    detections = CounterMetricFamily("yoloedge_detections_total", "Detections published, per model and label.",
                                     labels=("camera", "model", "label"))
    frames = CounterMetricFamily("yoloedge_model_frames_total", "Frames published, per camera and model.",
                                 labels=("camera", "model"))
    drops = CounterMetricFamily("yoloedge_model_drops_total", "Frames dropped from the camera's queue of the "
                                "model (keep-latest), per camera and model.", labels=("camera", "model"))
    latency = HistogramMetricFamily("yoloedge_frame_latency_seconds", "Capture to published, per frame.",
                                    labels=CAMERA_LABELS)
    for runtime in runtimes:
        for (model, label), count in sorted(runtime.detections_by_label().items()):
            detections.add_metric((runtime.name, model, label), count)
        for model, row in runtime.models_status().items():
            frames.add_metric((runtime.name, model), row["published"])
            drops.add_metric((runtime.name, model), row["drops"])
        add_histogram(latency, (runtime.name, runtime.group), runtime.latency_buckets)
    yield detections
    yield frames
    yield drops
    yield latency


def count_metrics(cameras: list[CameraStatus]) -> Iterator[Metric]:
    """Each camera's line crossings and the objects inside its zones (status' `lines`, `zones`)."""
    crossings = CounterMetricFamily("yoloedge_line_crossings_total",
                                    "Tracked objects that crossed the line, per direction and label "
                                    "(since the counts' `since`: reset-counts starts them again).",
                                    labels=("camera", "line", "direction", "label"))
    inside = GaugeMetricFamily("yoloedge_zone_objects", "Tracked objects inside the zone now, per label.",
                               labels=("camera", "zone", "label"))
    for cam in cameras:
        for line in cam.lines:
            for direction in ("in", "out"):
                for label, count in sorted((line.get(direction) or {}).items()):
                    crossings.add_metric((cam.name, line["name"], direction, label), count)
        for zone in cam.zones:
            for label, count in sorted((zone.get("objects") or {}).items()):
                inside.add_metric((cam.name, zone["name"], label), count)
    yield crossings
    yield inside


def sink_metrics(sinks: dict) -> Iterator[Metric]:
    """Failures of each result sink and stage (status' `sinks`): one failing does not stop the others."""
    errors = CounterMetricFamily("yoloedge_result_sink_errors_total",
                                 "Calls of a result sink or stage that raised (see status' sinks).",
                                 labels=("sink",))
    for name, entry in sorted(sinks.items()):
        errors.add_metric((name,), entry.get("errors") or 0)
    yield errors


def device_metrics(entries: list[WorkerStatus], workers: list[tuple[str, DeviceWorker]]) -> Iterator[Metric]:
    up = GaugeMetricFamily("yoloedge_device_up", "1 while the device serves batches.", labels=DEVICE_LABELS)
    for entry in entries:
        up.add_metric((entry.accelerator, str(entry.device)), 1 if entry.running else 0)
    yield up
    inference = HistogramMetricFamily("yoloedge_inference_seconds", "Device time per batch.", labels=DEVICE_LABELS)
    batch = HistogramMetricFamily("yoloedge_batch_size", "Frames per batch.", labels=DEVICE_LABELS)
    steps = {step: HistogramMetricFamily(f"yoloedge_device_{step}_seconds", f"{what} per batch, from backends "
                                         f"that time the steps apart (Ascend).", labels=DEVICE_LABELS)
             for step, what in (("copy_in", "Copying the frames to the device"), ("execute", "Executing the model"),
                                ("copy_out", "Copying the outputs back"))}
    for accelerator, worker in workers:
        labels = (accelerator, str(worker.device))
        add_histogram(inference, labels, worker.stats.infer_buckets)
        add_histogram(batch, labels, worker.stats.batch_buckets)
        for step, family in steps.items():
            meters = worker.stats.steps[step]
            if sum(meters.buckets.snapshot()[0]):  # a device whose backend never timed this step: no series
                add_histogram(family, labels, meters.buckets)
    yield inference
    yield batch
    yield from steps.values()
    yield from model_metrics(entries)


def model_metrics(entries: list[WorkerStatus]) -> Iterator[Metric]:
    """Per device and model: the batches it ran, the memory its buffers take (status' `models`)."""
    labels = (*DEVICE_LABELS, "model")
    batches = CounterMetricFamily("yoloedge_model_batches_total", "Batches of the model the device ran "
                                  "(this opening of the device).", labels=labels)
    memory = GaugeMetricFamily("yoloedge_model_memory_bytes", "What the model's buffers take on the device "
                               "and in (pinned) host memory.", labels=(*labels, "kind"))
    for entry in entries:
        for model in entry.report.get("models") or ():
            key = (entry.accelerator, str(entry.device), model["name"])
            batches.add_metric(key, model.get("batches") or 0)
            for kind in ("device", "host"):
                size = (model.get("memory") or {}).get(f"{kind}_bytes")
                if size is not None:
                    memory.add_metric((*key, kind), size)
    yield batches
    yield memory


def mqtt_metrics(mqtt: dict) -> Iterator[Metric]:
    yield GaugeMetricFamily("yoloedge_mqtt_connected", "1 while connected to the broker.",
                            value=1 if mqtt.get("connected") else 0)
    yield GaugeMetricFamily("yoloedge_mqtt_queued_messages", "Messages waiting to be sent or acknowledged.",
                            value=mqtt.get("queued") or 0)
    yield CounterMetricFamily("yoloedge_mqtt_dropped_total", "Messages dropped (queue full, QoS 0 while "
                                                             "disconnected, spool limit).",
                              value=mqtt.get("dropped") or 0)


def add_histogram(family: HistogramMetricFamily, labels: Iterable[str], counts: BucketCounts) -> None:
    per_bucket, total = counts.snapshot()
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*counts.bounds, float("inf")), per_bucket):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    family.add_metric(list(labels), buckets, total)


def new_registry(meters: Callable[[], Meters]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DaemonCollector(meters))
    ProcessCollector(registry=registry)
    return registry

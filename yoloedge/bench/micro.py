"""Micro- and model benchmarks: our stages side by side with plain OpenCV/NumPy, cv2.dnn,
torchvision (when installed) and the bare ONNX Runtime session, measured in one run.

Numbers are medians over `repeat` runs after a warm-up; they go into docs/benchmarks.md.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import cv2
import numpy as np


@dataclass
class Timing:
    name: str
    median_ms: float
    p90_ms: float
    note: str = ""
    #: the package a peer needs and this host lacks: the row says so instead of timing anything
    missing: str | None = None

    @classmethod
    def not_installed(cls, name: str, package: str) -> "Timing":
        return cls(name, float("nan"), float("nan"), missing=package)


def measure(name: str, fn: Callable[[], object], repeat: int, note: str = "") -> Timing:
    for _ in range(max(3, repeat // 10)):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return Timing(name, statistics.median(samples), samples[int(0.9 * (len(samples) - 1))], note)


def format_table(title: str, rows: list[Timing]) -> str:
    """The rows under `title`, each against the first; a peer that is not installed reads
    "n/a (not installed: torchvision)", not a column of `nan` that looks like a failed measurement."""
    base = rows[0].median_ms if rows and rows[0].missing is None else 0.0
    width = max(len(r.name) for r in rows) if rows else 10
    lines = [title, f"  {'':<{width}}  {'median ms':>9}  {'p90 ms':>8}  {'vs first':>8}"]
    for r in rows:
        if r.missing is not None:
            lines.append(f"  {r.name:<{width}}  n/a (not installed: {r.missing})")
            continue
        ratio = f"{r.median_ms / base:>7.2f}x" if base else f"{'n/a':>8}"
        lines.append(f"  {r.name:<{width}}  {r.median_ms:>9.3f}  {r.p90_ms:>8.3f}  {ratio}"
                     + (f"  {r.note}" if r.note else ""))
    return "\n".join(lines)


# -- letterbox ---------------------------------------------------------------------------------
def bench_letterbox(frame: np.ndarray, size: int, repeat: int) -> list[Timing]:
    from ..preprocess import Letterboxer

    h, w = frame.shape[:2]
    buf = np.empty((1, 3, size, size), np.float32)
    buf16 = np.empty((1, 3, size, size), np.float16)
    ours = Letterboxer(size, size)
    ours16 = Letterboxer(size, size)
    r = min(size / h, size / w)
    nw, nh = int(round(w * r)), int(round(h * r))
    top, left = int(round((size - nh) / 2 - 0.1)), int(round((size - nw) / 2 - 0.1))

    def plain_resize_copy():
        # What most sample code does: resize, pad with copyMakeBorder, BGR->RGB, HWC->CHW, scale.
        img = cv2.resize(frame, (nw, nh), interpolation=cv2.INTER_LINEAR)
        img = cv2.copyMakeBorder(img, top, size - nh - top, left, size - nw - left,
                                 cv2.BORDER_CONSTANT, value=(114, 114, 114))
        buf[0] = img[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / 255.0

    def blob_from_image():
        img = cv2.resize(frame, (nw, nh), interpolation=cv2.INTER_LINEAR)
        img = cv2.copyMakeBorder(img, top, size - nh - top, left, size - nw - left,
                                 cv2.BORDER_CONSTANT, value=(114, 114, 114))
        buf[:] = cv2.dnn.blobFromImage(img, 1 / 255.0, swapRB=True)

    def resize_only():
        cv2.resize(frame, (nw, nh), interpolation=cv2.INTER_LINEAR)

    return [
        measure("yoloedge Letterboxer -> float32", lambda: ours(frame, buf[0]), repeat),
        measure("yoloedge Letterboxer -> float16", lambda: ours16(frame, buf16[0]), repeat),
        measure("plain resize+pad+transpose", plain_resize_copy, repeat),
        measure("resize+pad+cv2.dnn.blobFromImage", blob_from_image, repeat),
        measure("cv2.resize alone (lower bound)", resize_only, repeat),
    ]


# -- decode + NMS ------------------------------------------------------------------------------
def bench_decode_nms(output: np.ndarray, conf: float, iou: float, repeat: int) -> list[Timing]:
    """`output` is one image's v8 output [4+nc, N]."""
    from ..postprocess import Layout, PostprocessSettings, Postprocessor, make_decoder
    from ..preprocess import Geometry

    nc = output.shape[0] - 4
    post = Postprocessor(make_decoder(Layout("v8", nc)), PostprocessSettings(conf=conf, iou=iou))
    geo = Geometry(640, 640, 640, 640, 0, 0)
    rows = [measure("yoloedge decode+NMS", lambda: post([output], geo), repeat,
                    note=f"{len(post([output], geo))} boxes")]

    def opencv():
        scores_all = output[4:]
        best = scores_all.max(axis=0)
        idx = np.flatnonzero(best > conf)
        cls = scores_all[:, idx].argmax(axis=0)
        xywh = output[:4, idx].T.copy()
        xywh[:, :2] -= xywh[:, 2:4] / 2
        keep = cv2.dnn.NMSBoxesBatched(xywh.tolist(), best[idx].tolist(), cls.tolist(), conf, iou)
        return keep

    rows.append(measure("numpy decode + cv2.dnn.NMSBoxesBatched", opencv, repeat,
                        note=f"{len(opencv())} boxes"))
    try:
        import torch
        import torchvision
    except Exception:  # noqa: BLE001 - optional peer, any import failure means "not available"
        rows.append(Timing.not_installed("torch decode + torchvision batched_nms", "torchvision"))
        return rows
    t_out = torch.from_numpy(np.ascontiguousarray(output))

    def tv():
        scores_all = t_out[4:]
        best, cls = scores_all.max(dim=0)
        mask = best > conf
        xywh = t_out[:4, mask].T
        boxes = torch.cat([xywh[:, :2] - xywh[:, 2:] / 2, xywh[:, :2] + xywh[:, 2:] / 2], dim=1)
        return torchvision.ops.batched_nms(boxes, best[mask], cls[mask], iou)

    rows.append(measure("torch decode + torchvision batched_nms", tv, repeat, note=f"{len(tv())} boxes"))
    return rows


# -- whole model -------------------------------------------------------------------------------
def bench_model(model_path: str, frame: np.ndarray, repeat: int, threads: int = 0) -> list[Timing]:
    """Our full detect() against the bare ONNX Runtime session on the same pre-filled input."""
    import onnxruntime as ort

    from ..config import ModelConfig, OnnxRuntimeConfig
    from ..pipeline.detector import open_detector

    cfg = OnnxRuntimeConfig(intra_op_threads=threads)
    det = open_detector(ModelConfig(path=model_path), backend_config=cfg)
    det.preprocess([frame])
    feed = {det.spec.input.name: det.backend.input_buffer[:1].copy()}
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    raw_default = ort.InferenceSession(model_path, opts, providers=["CPUExecutionProvider"])
    rows = [
        measure("yoloedge detect (letterbox+run+decode+NMS)", lambda: det.detect([frame]), repeat),
        measure("yoloedge backend.run only", lambda: det.infer(1), repeat),
        measure("bare ORT session.run (default options)", lambda: raw_default.run(None, feed), repeat),
    ]
    det.close()
    return rows


# -- event best shots --------------------------------------------------------------------------
def bench_event_shot(frame: np.ndarray, repeat: int) -> list[Timing]:
    """What one event best shot costs the router's thread (`EventLog.best_shot`: a frame copy,
    the box drawn, the JPEG encoded) and how large it is. Each call is a second of frame time
    after the one before, so every call encodes."""
    from ..events.recent import EventLog

    log = EventLog()
    log.record({"id": "bench-1", "camera": "bench", "label": "person"})
    height, width = frame.shape[:2]
    box = (width * 0.3, height * 0.2, width * 0.6, height * 0.9)
    clock = [0.0]

    def shot() -> None:
        clock[0] += 1.0
        log.best_shot("bench", "bench-1", frame, box, 0.9, clock[0])

    row = measure("copy + draw + JPEG encode (EventLog.best_shot)", shot, repeat)
    size = len(log.snapshot("bench-1") or b"")
    return [Timing(row.name, row.median_ms, row.p90_ms, f"{size / 1e3:.0f} kB per shot")]
# -- tracking ----------------------------------------------------------------------------------
def bench_tracking(repeat: int, objects: int = 20) -> list[Timing]:
    """One Tracker.update per frame on `objects` moving boxes (plus a few low-score candidates that
    match nothing), in the steady state: every track confirmed and matched, moving a little each
    frame at 10 fps."""
    from ..postprocess import Detections
    from ..config.schema import TrackingConfig
    from ..tracking import Tracker, TrackIds

    rng = np.random.default_rng(0)
    start = rng.uniform(0, 1700, (objects, 2))
    velocity = rng.uniform(-40, 40, (objects, 2))  # px/s
    size = rng.uniform(40, 160, (objects, 2))

    def frame(t: float) -> Detections:
        xy = start + velocity * t + rng.normal(0, 1.0, (objects, 2))
        boxes = np.concatenate((xy, xy + size), axis=1)
        ghosts = boxes[: objects // 4] + 300
        scores = np.concatenate((rng.uniform(0.5, 0.95, objects), rng.uniform(0.1, 0.2, len(ghosts))))
        order = np.argsort(-scores)
        return Detections(np.concatenate((boxes, ghosts))[order].astype(np.float32), scores[order].astype(np.float32),
                          (np.arange(len(scores)) % 5)[order].astype(np.int32), 1920, 1080)

    total = 5 + max(3, repeat // 10) + repeat
    frames = [(frame(k / 10), k / 10) for k in range(total + 1)]
    tracker = Tracker(TrackingConfig(), [f"class{i}" for i in range(80)], ids=TrackIds(prefix="bench"))
    feed = iter(frames)
    for _ in range(5):
        tracker.update(*next(feed))
    last = {"tracks": 0}

    def step() -> None:
        last["tracks"] = len(tracker.update(*next(feed)).tracks)

    row = measure(f"yoloedge Tracker.update, {objects} objects", step, repeat)
    row.note = f"{last['tracks']} tracks"
    return [row]

"""Per-layout decoders: raw model output of one image -> candidate boxes, scores and classes.

Every decoder returns boxes as xyxy float32 in model-input (letterbox) pixels, scores float32 and
class ids int32, already filtered by the confidence threshold; NMS and the mapping back to source
pixels happen once, in `postprocessor`. Work is done on the candidates that pass the threshold
only, so the cost is dominated by one max-reduction over the class scores.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .layouts import DFL_BINS, Layout

Candidates = tuple[np.ndarray, np.ndarray, np.ndarray]


def empty_candidates() -> Candidates:
    return np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32)


def xywh_to_xyxy(xywh: np.ndarray) -> np.ndarray:
    xywh = xywh.astype(np.float32, copy=False)
    half = xywh[:, 2:4] / 2
    return np.concatenate([xywh[:, 0:2] - half, xywh[:, 0:2] + half], axis=1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float32, copy=False)))


class Decoder:
    """Decodes one image's outputs (batch axis removed) with the thresholds given per call."""

    def __init__(self, layout: Layout):
        self.layout = layout

    def __call__(self, outputs: Sequence[np.ndarray], conf: float) -> Candidates:
        raise NotImplementedError


class V8Decoder(Decoder):
    """[4+nc, N]: cx cy w h, then per-class scores (already sigmoided), no objectness."""

    def __call__(self, outputs, conf):
        out = outputs[0]
        if self.layout.transposed:
            out = out.T
        cls = out[4:]
        best = cls.max(axis=0)
        idx = np.flatnonzero(best > conf)
        if not idx.size:
            return empty_candidates()
        scores = best[idx].astype(np.float32)
        class_ids = cls[:, idx].argmax(axis=0).astype(np.int32)
        boxes = xywh_to_xyxy(out[:4, idx].T)
        return boxes, scores, class_ids


class V5Decoder(Decoder):
    """[N, 5+nc]: cx cy w h, objectness, class probabilities; score = obj x cls.

    As YOLOv5's own NMS does, rows are first kept on objectness > conf (a row whose objectness is
    below the threshold cannot reach it once multiplied by a class probability <= 1).
    """

    def __call__(self, outputs, conf):
        idx, rows = _rows_above(outputs[0], conf)
        return _objectness_candidates(rows, conf) if idx.size else empty_candidates()


def _rows_above(out: np.ndarray, conf: float) -> tuple[np.ndarray, np.ndarray]:
    """Indices and float32 copies of the rows whose column 4 (objectness / score) beats `conf`."""
    idx = np.flatnonzero(out[:, 4] > conf)
    return idx, out[idx].astype(np.float32)


def _objectness_candidates(rows: np.ndarray, conf: float) -> Candidates:
    """rows [n, 5+nc] with decoded cx cy w h; score = obj x best class."""
    cls = rows[:, 5:] * rows[:, 4:5]
    class_ids = cls.argmax(axis=1)
    scores = cls[np.arange(len(rows)), class_ids]
    keep = scores > conf
    return xywh_to_xyxy(rows[keep, :4]), scores[keep].astype(np.float32), class_ids[keep].astype(np.int32)


class YoloxDecoder(Decoder):
    """[N, 5+nc] raw YOLOX head: cx = (tx + gx) * s, w = exp(tw) * s; obj and cls already sigmoided."""

    def __init__(self, layout: Layout):
        super().__init__(layout)
        grids, strides = [], []
        for (gh, gw), s in zip(layout.grid_shapes, layout.strides):
            ys, xs = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
            grids.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
            strides.append(np.full((gh * gw, 1), s))
        self._grid = np.concatenate(grids).astype(np.float32)
        self._stride = np.concatenate(strides).astype(np.float32)

    def __call__(self, outputs, conf):
        idx, rows = _rows_above(outputs[0], conf)  # rows is a copy: safe to decode in place
        if not idx.size:
            return empty_candidates()
        s = self._stride[idx]
        rows[:, 0:2] = (rows[:, 0:2] + self._grid[idx]) * s
        rows[:, 2:4] = np.exp(rows[:, 2:4]) * s
        return _objectness_candidates(rows, conf)


class E2EDecoder(Decoder):
    """[K, 6]: x1 y1 x2 y2 score class, already suppressed by the model (YOLOv10 / YOLO26)."""

    def __call__(self, outputs, conf):
        idx, rows = _rows_above(outputs[0], conf)
        if not idx.size:
            return empty_candidates()
        return rows[:, :4].copy(), rows[:, 4].copy(), rows[:, 5].round().astype(np.int32)


class _RawHeads(Decoder):
    """Shared by the multi-head decoders: put every map into [positions, channels] order."""

    def _levels(self, outputs):
        # Heads may come back in any order; match them to the layout's grids by spatial size.
        by_size = {}
        for o in outputs:
            by_size.setdefault(self._grid_of(o), o)
        return [by_size[g] for g in self.layout.grid_shapes]

    def _grid_of(self, o):
        order = self.layout.map_order
        if order == "chw":
            return o.shape[-2], o.shape[-1]
        if order == "hwc":
            return o.shape[0], o.shape[1]
        return o.shape[1], o.shape[2]

    @staticmethod
    def _anchor_points(gh, gw, offset):
        ys, xs = np.meshgrid(np.arange(gh, dtype=np.float32), np.arange(gw, dtype=np.float32), indexing="ij")
        return np.stack([xs.ravel(), ys.ravel()], axis=1) + offset


class RawAnchorDecoder(_RawHeads):
    """YOLOv5-style heads: na*(5+nc) logits per cell; xy = (2*sig - 0.5 + g) * s, wh = (2*sig)^2 * anchor."""

    def __init__(self, layout: Layout):
        super().__init__(layout)
        self._na = len(layout.anchors[0])
        self._no = layout.num_classes + 5
        self._grids = [self._anchor_points(gh, gw, 0.0) for gh, gw in layout.grid_shapes]

    def _rows(self, o):
        gh, gw = self._grid_of(o)
        order = self.layout.map_order
        if order == "chw":  # [na*no, H, W] -> [na, H*W, no]
            return o.reshape(self._na, self._no, gh * gw).transpose(0, 2, 1)
        if order == "hwc":  # [H, W, na*no]
            return o.reshape(gh * gw, self._na, self._no).transpose(1, 0, 2)
        return o.reshape(self._na, gh * gw, self._no)

    def __call__(self, outputs, conf):
        # sigmoid is monotonic, so the objectness test runs on logits.
        logit_conf = np.float32(np.log(conf / (1 - conf))) if 0 < conf < 1 else None
        found = []
        for o, grid, s, anchors in zip(self._levels(outputs), self._grids, self.layout.strides,
                                       self.layout.anchors):
            rows = self._rows(o)
            for a, (aw, ah) in enumerate(anchors):
                ra = rows[a]
                idx = np.flatnonzero(ra[:, 4] > logit_conf) if logit_conf is not None else np.arange(len(ra))
                if not idx.size:
                    continue
                r = _sigmoid(ra[idx])
                r[:, 0:2] = (r[:, 0:2] * 2 - 0.5 + grid[idx]) * s
                r[:, 2:4] = (r[:, 2:4] * 2) ** 2 * np.array([aw, ah], np.float32)
                found.append(r)
        if not found:
            return empty_candidates()
        return _objectness_candidates(np.concatenate(found), conf)


class RawDflDecoder(_RawHeads):
    """YOLOv8-style heads: 4x16 DFL bins + nc class logits per cell, anchor-free."""

    def __init__(self, layout: Layout):
        super().__init__(layout)
        self._points = [self._anchor_points(gh, gw, 0.5) for gh, gw in layout.grid_shapes]
        self._bins = np.arange(DFL_BINS, dtype=np.float32)

    def __call__(self, outputs, conf):
        logit_conf = np.float32(np.log(conf / (1 - conf))) if 0 < conf < 1 else -np.inf
        boxes, scores, classes = [], [], []
        for o, points, s in zip(self._levels(outputs), self._points, self.layout.strides):
            gh, gw = self._grid_of(o)
            m = o.reshape(-1, gh * gw) if self.layout.map_order == "chw" else o.reshape(gh * gw, -1).T
            cls = m[4 * DFL_BINS:]
            best = cls.max(axis=0)
            idx = np.flatnonzero(best > logit_conf)
            if not idx.size:
                continue
            dist = m[:4 * DFL_BINS, idx].astype(np.float32).reshape(4, DFL_BINS, -1)
            dist = np.exp(dist - dist.max(axis=1, keepdims=True))
            dist = (dist * self._bins[None, :, None]).sum(axis=1) / dist.sum(axis=1)  # [4, n]
            p = points[idx]
            boxes.append(np.stack([p[:, 0] - dist[0], p[:, 1] - dist[1],
                                   p[:, 0] + dist[2], p[:, 1] + dist[3]], axis=1) * s)
            scores.append(_sigmoid(best[idx]))
            classes.append(cls[:, idx].argmax(axis=0))
        if not boxes:
            return empty_candidates()
        return (np.concatenate(boxes).astype(np.float32), np.concatenate(scores).astype(np.float32),
                np.concatenate(classes).astype(np.int32))


DECODERS: dict[str, Callable[[Layout], Decoder]] = {
    "v8": V8Decoder,
    "v5": V5Decoder,
    "yolox": YoloxDecoder,
    "e2e": E2EDecoder,
    "raw": RawAnchorDecoder,
    "raw_v8": RawDflDecoder,
}


def make_decoder(layout: Layout) -> Decoder:
    return DECODERS[layout.format](layout)

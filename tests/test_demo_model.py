"""The demo model the project ships (yoloedge/demo): a file that fits, and detections that are right.

The model was trained on synthetic shapes by scripts/train_demo_model.py; the clip and its ground
truth come from scripts/make_demo_clip.py. mAP is computed here by tests/map_eval.py, a standard
VOC computation that shares no code with yoloedge or Ultralytics.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from map_eval import average_precision, voc_ap

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import demo_data  # noqa: E402
from yoloedge.config import ModelConfig  # noqa: E402
from yoloedge.demo import LABELS, MODEL, TRUTH, clip_path  # noqa: E402
from yoloedge.pipeline.detector import open_detector  # noqa: E402

MAX_MODEL_BYTES = 6 * 1024 * 1024
MIN_CLIP_MAP50 = 0.90


@pytest.fixture(scope="module")
def truth() -> dict:
    return json.loads(TRUTH.read_text())


@pytest.fixture(scope="module")
def clip_frames() -> list[np.ndarray]:
    cap = cv2.VideoCapture(str(clip_path()))
    assert cap.isOpened(), f"cannot open {clip_path()}"
    frames = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        frames.append(frame)
    cap.release()
    return frames


# -- (a) the model file ------------------------------------------------------------------------

def test_model_file_is_small_with_dynamic_batch_and_matching_labels():
    import onnxruntime as ort

    assert MODEL.is_file(), f"{MODEL} is missing: run scripts/train_demo_model.py"
    assert MODEL.stat().st_size <= MAX_MODEL_BYTES, f"{MODEL} is {MODEL.stat().st_size} bytes"
    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    assert len(inp.shape) == 4
    assert not isinstance(inp.shape[0], int), f"batch axis is fixed: {inp.shape}"
    labels = [line.strip() for line in LABELS.read_text().splitlines() if line.strip()]
    assert labels == list(demo_data.NAMES)
    meta = session.get_modelmeta().custom_metadata_map
    names = ast.literal_eval(meta["names"])  # Ultralytics writes {0: 'circle', ...}
    assert [names[i] for i in sorted(names)] == labels


def test_model_runs_a_batch_of_frames(clip_frames):
    detector = open_detector(ModelConfig(path=str(MODEL), labels=str(LABELS)), max_batch=4)
    try:
        assert detector.labels == list(demo_data.NAMES)
        batched = detector.detect(clip_frames[:4])
        single = [detector.detect([f])[0] for f in clip_frames[:4]]
    finally:
        detector.close()
    for b, s in zip(batched, single):  # the same detections, batched or not (float noise aside)
        sure_b, sure_s = b.scores >= 0.5, s.scores >= 0.5
        assert sure_b.sum() == sure_s.sum() > 0
        np.testing.assert_allclose(b.boxes[sure_b], s.boxes[sure_s], atol=0.05)
        np.testing.assert_array_equal(b.class_ids[sure_b], s.class_ids[sure_s])


# -- (b) detection quality on the clip ----------------------------------------------------------

def test_clip_map50(truth, clip_frames):
    detector = open_detector(ModelConfig(path=str(MODEL), labels=str(LABELS), conf=0.01), max_batch=4)
    try:
        results = detector.detect(clip_frames)
    finally:
        detector.close()
    predictions = [d.to_dicts(detector.labels) for d in results]
    gt = [f["objects"] for f in truth["frames"]]
    assert len(predictions) == len(gt)
    mean, per_class = average_precision(predictions, gt, iou=0.5)
    report = ", ".join(f"{truth['names'][c]} {ap:.3f}" for c, ap in per_class.items())
    print(f"\nclip mAP@0.5 {mean:.4f} ({report})")
    assert set(per_class) == set(range(len(truth["names"])))
    assert mean >= MIN_CLIP_MAP50, f"clip mAP@0.5 {mean:.4f} < {MIN_CLIP_MAP50} ({report})"


# -- (c) the clip -------------------------------------------------------------------------------

def test_clip_decodes_to_the_frames_of_its_ground_truth(truth, clip_frames):
    assert len(clip_frames) == len(truth["frames"]) > 0
    assert [f["index"] for f in truth["frames"]] == list(range(len(truth["frames"])))
    w, h = truth["size"]
    assert all(f.shape == (h, w, 3) for f in clip_frames)
    assert truth["names"] == list(demo_data.NAMES)
    assert clip_path().stat().st_size < 1_500_000


# -- (d) the generator is deterministic ---------------------------------------------------------

def test_render_scene_is_deterministic():
    a_img, a_boxes = demo_data.render_scene(np.random.default_rng(7), (320, 240), 6)
    b_img, b_boxes = demo_data.render_scene(np.random.default_rng(7), (320, 240), 6)
    c_img, _ = demo_data.render_scene(np.random.default_rng(8), (320, 240), 6)
    assert a_img.tobytes() == b_img.tobytes()
    assert a_boxes == b_boxes and len(a_boxes) > 0
    assert a_img.tobytes() != c_img.tobytes()


def test_make_dataset_is_deterministic(tmp_path):
    def digest(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.rglob("*")) if p.is_file() and p.name != "data.yaml"}

    demo_data.make_dataset(tmp_path / "a", 3, 2, 160, seed=5)
    demo_data.make_dataset(tmp_path / "b", 3, 2, 160, seed=5)
    a, b = digest(tmp_path / "a"), digest(tmp_path / "b")
    assert len(a) == 2 * (3 + 2) and a == b
    yaml_text = (tmp_path / "a" / "data.yaml").read_text()
    assert all(f"{i}: {n}" in yaml_text for i, n in enumerate(demo_data.NAMES))


def test_clip_generator_is_deterministic_and_matches_the_shipped_truth(truth):
    w, h = truth["size"]
    frames = len(truth["frames"])
    first = list(_take(demo_data.render_clip((w, h), frames, truth["seed"]), 3))
    again = list(_take(demo_data.render_clip((w, h), frames, truth["seed"]), 3))
    for (ia, ba), (ib, bb) in zip(first, again):
        assert ia.tobytes() == ib.tobytes() and ba == bb
    for (_, boxes), shipped in zip(first, truth["frames"]):
        assert [b["class_id"] for b in boxes] == [o["class_id"] for o in shipped["objects"]]
        np.testing.assert_allclose([b["box"] for b in boxes], [o["box"] for o in shipped["objects"]],
                                   atol=0.006)


def test_boxes_are_exact():
    """A shape's box is its outline's box: the rendered pixels fill it edge to edge."""
    bg = np.zeros((100, 100, 3), np.uint8)
    shapes = [demo_data.Shape(1, 50.0, 50.0, 20 * 2 ** 0.5, 0.0, color=(255, 255, 255))]  # 40x40 square
    img, boxes = demo_data.render_scene(np.random.default_rng(0), (100, 100), shapes, background=bg,
                                        effects=False)
    assert boxes[0]["box"] == pytest.approx([30, 30, 70, 70])
    assert boxes[0]["visible"] == pytest.approx(1.0, abs=0.01)
    ys, xs = np.nonzero(img.max(axis=2) > 128)
    assert (xs.min(), xs.max() + 1, ys.min(), ys.max() + 1) == (30, 70, 30, 70)


def _take(it, n):
    for _, item in zip(range(n), it):
        yield item


# -- the AP computation itself ------------------------------------------------------------------

def test_average_precision_by_hand():
    truth = [[{"class_id": 0, "box": [0, 0, 10, 10]}, {"class_id": 0, "box": [20, 20, 30, 30]}],
             [{"class_id": 1, "box": [0, 0, 10, 10]},
              {"class_id": 1, "box": [50, 50, 60, 60], "difficult": True}]]
    preds = [[{"class_id": 0, "score": 0.9, "box": [0, 0, 10, 10]},      # TP
              {"class_id": 0, "score": 0.8, "box": [0, 0, 10, 11]},      # duplicate: FP
              {"class_id": 0, "score": 0.7, "box": [21, 21, 31, 31]}],   # IoU 0.68: TP
             [{"class_id": 1, "score": 0.6, "box": [50, 50, 60, 60]},    # difficult: ignored
              {"class_id": 1, "score": 0.5, "box": [5, 0, 15, 10]}]]     # IoU 1/3: FP
    mean, per_class = average_precision(preds, truth)
    # class 0: P/R after each: (1, .5) (.5, .5) (.667, 1) -> AP = .5*1 + .5*.667
    assert per_class[0] == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert per_class[1] == 0.0
    assert mean == pytest.approx((0.5 + 0.5 * 2 / 3) / 2)
    as_tuples = average_precision(
        {i: [(p["class_id"], p["score"], p["box"]) for p in frame] for i, frame in enumerate(preds)},
        {i: [(t["class_id"], t["box"], t.get("difficult", False)) for t in frame] for i, frame in enumerate(truth)})
    assert as_tuples == (mean, per_class)
    perfect = [[dict(o, score=1.0) for o in frame] for frame in truth]
    assert average_precision(perfect, truth) == (1.0, {0: 1.0, 1: 1.0})
    assert voc_ap(np.array([0.5, 1.0]), np.array([0.5, 1.0])) == 1.0  # interpolated from the right

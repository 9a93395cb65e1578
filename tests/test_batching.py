"""Batches through the Detector: one result per frame, in order, each frame its own answer;
dynamic-batch models run a batch in one backend call, fixed-batch models loop; and a real model
made dynamic-batch gives the same detections batched as one frame at a time.

The synthetic "colour meter" models are described in tests/onnx_models.py: class 0 ("red") is found
at a fixed box with score = mean red of the model input, class 1 ("blue") at another box with
score = mean blue. Expected scores and boxes below are worked out by hand from the letterbox rule
(scale r = min(64/h, 64/w), size round(w*r) x round(h*r), centred, pad 114), not taken from a run.
"""

from __future__ import annotations

import cv2
import numpy as np
import pytest

pytest.importorskip("onnx")

from onnx_models import (  # noqa: E402
    make_dynamic_batch_copy_of,
    make_dynamic_batch_v8_model,
    make_fixed_batch_v8_model,
)
from parity import mismatches, output_quantisation, tolerance_for  # noqa: E402
from yoloedge.config import ModelConfig  # noqa: E402
from yoloedge.pipeline.detector import open_detector  # noqa: E402

SIZE = 64
LABELS = ["red", "blue"]
# Boxes of the colour meter in model-input pixels (x1, y1, x2, y2), from its construction:
# class 0: centre (32, 32), 32 x 32; class 1: centre (16, 48), 16 x 16.
RED_BOX_INPUT = (16.0, 16.0, 48.0, 48.0)
BLUE_BOX_INPUT = (8.0, 40.0, 24.0, 56.0)


def solid(h, w, bgr):
    return np.full((h, w, 3), bgr, np.uint8)


# (frame, {class_id: (score, box in source pixels)}) — all worked out by hand.
CASES = [
    # 64x64 pure red fills the input exactly (r = 1, no padding): red mean 1, blue mean 0.
    (solid(64, 64, (0, 0, 255)), {0: (1.0, RED_BOX_INPUT)}),
    # 128x128 pure blue: r = 0.5, no padding; boxes scale by 2.
    (solid(128, 128, (255, 0, 0)), {1: (1.0, (16.0, 80.0, 48.0, 112.0))}),
    # 128 wide x 64 high, B=200 R=100: r = 0.5 -> 64x32 at top 16, half the input is padding (114).
    # red = (100 + 114) / 2 / 255, blue = (200 + 114) / 2 / 255.
    # red box: x (16..48)/0.5 = 32..96, y (16-16..48-16)/0.5 = 0..64.
    # blue box: x 16..48, y (40-16)/0.5 = 48 .. (56-16)/0.5 = 80 -> clipped to the frame's 64.
    (solid(64, 128, (200, 0, 100)), {0: ((100 + 114) / 2 / 255, (32.0, 0.0, 96.0, 64.0)),
                                     1: ((200 + 114) / 2 / 255, (16.0, 48.0, 48.0, 64.0))}),
    # 64 wide x 96 high, all 20: r = 2/3 -> 43x64 at left 10; 21 columns of padding.
    # red = blue = (43*20 + 21*114) / 64 / 255 = 0.1994 < conf 0.25: no detections.
    (solid(96, 64, (20, 20, 20)), {}),
]


def check(result, expected, what=""):
    got = {int(c): (float(s), tuple(map(float, b)))
           for c, s, b in zip(result.class_ids, result.scores, result.boxes)}
    assert set(got) == set(expected), f"{what}: classes {sorted(got)} != {sorted(expected)}"
    for cid, (score, box) in expected.items():
        assert got[cid][0] == pytest.approx(score, abs=1e-5), f"{what}: class {cid} score"
        assert got[cid][1] == pytest.approx(box, abs=1e-3), f"{what}: class {cid} box"


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    d = tmp_path_factory.mktemp("synthetic")
    return {
        "dynamic": make_dynamic_batch_v8_model(d / "dynamic.onnx", size=SIZE, nc=2),
        "fixed1": make_fixed_batch_v8_model(d / "fixed1.onnx", size=SIZE, nc=2),
        "fixed2": make_fixed_batch_v8_model(d / "fixed2.onnx", size=SIZE, nc=2, batch=2),
    }


def detector_for(path, max_batch, **extra):
    return open_detector(ModelConfig(path=str(path), labels=LABELS, **extra), max_batch=max_batch)


class CallCounter:
    """Wraps the backend's session.run_with_iobinding; records the batch of each call."""

    def __init__(self, monkeypatch, detector):
        self.batches: list[int] = []
        session = detector.backend._session
        real = session.run_with_iobinding

        def counting(binding, *args, **kwargs):
            result = real(binding, *args, **kwargs)
            self.batches.append(binding.get_outputs()[0].shape()[0])
            return result

        monkeypatch.setattr(session, "run_with_iobinding", counting)


def test_each_frame_of_a_mixed_batch_gets_its_own_answer(synthetic):
    det = detector_for(synthetic["dynamic"], max_batch=len(CASES))
    results = det.detect([frame for frame, _ in CASES])
    assert len(results) == len(CASES)
    for i, (result, (frame, expected)) in enumerate(zip(results, CASES)):
        assert (result.width, result.height) == (frame.shape[1], frame.shape[0]), f"frame {i} size"
        check(result, expected, f"frame {i}")
    det.close()


def test_order_follows_the_frames_not_the_content(synthetic):
    det = detector_for(synthetic["dynamic"], max_batch=4)
    order = [2, 0, 3, 1]
    results = det.detect([CASES[i][0] for i in order])
    for slot, i in enumerate(order):
        check(results[slot], CASES[i][1], f"slot {slot} (case {i})")
    det.close()


def test_dynamic_batch_model_runs_a_batch_in_one_backend_call(synthetic, monkeypatch):
    det = detector_for(synthetic["dynamic"], max_batch=4)
    assert det.backend.batch_sizes == (1, 2, 3, 4)
    calls = CallCounter(monkeypatch, det)
    det.detect([frame for frame, _ in CASES[:3]])
    assert calls.batches == [3]
    det.close()


def test_fixed_batch_1_model_loops_and_agrees_with_the_dynamic_one(synthetic, monkeypatch):
    frames = [frame for frame, _ in CASES]
    dyn = detector_for(synthetic["dynamic"], max_batch=4)
    fixed = detector_for(synthetic["fixed1"], max_batch=4)
    assert fixed.backend.batch_sizes == (1,)
    calls = CallCounter(monkeypatch, fixed)
    a, b = dyn.detect(frames), fixed.detect(frames)
    assert calls.batches == [1, 1, 1, 1]
    for i, (x, y, (_, expected)) in enumerate(zip(a, b, CASES)):
        check(y, expected, f"fixed-batch frame {i}")
        np.testing.assert_array_equal(x.boxes, y.boxes)
        np.testing.assert_array_equal(x.scores, y.scores)
        np.testing.assert_array_equal(x.class_ids, y.class_ids)
    dyn.close()
    fixed.close()


def test_fixed_batch_2_model_runs_in_chunks_of_2_with_an_odd_count(synthetic, monkeypatch):
    det = detector_for(synthetic["fixed2"], max_batch=3)
    assert det.backend.batch_sizes == (2,)
    calls = CallCounter(monkeypatch, det)
    results = det.detect([frame for frame, _ in CASES[:3]])
    assert calls.batches == [2, 2]
    assert len(results) == 3
    for i, (result, (_, expected)) in enumerate(zip(results, CASES[:3])):
        check(result, expected, f"frame {i}")
    det.close()


def test_more_frames_than_max_batch_are_split_into_chunks(synthetic, monkeypatch):
    det = detector_for(synthetic["dynamic"], max_batch=2)
    calls = CallCounter(monkeypatch, det)
    cases = CASES + CASES[:1]  # 5 frames
    results = det.detect([frame for frame, _ in cases])
    assert calls.batches == [2, 2, 1]
    assert len(results) == 5
    for i, (result, (frame, expected)) in enumerate(zip(results, cases)):
        assert (result.width, result.height) == (frame.shape[1], frame.shape[0])
        check(result, expected, f"frame {i}")
    det.close()


def test_preprocess_refuses_more_frames_than_the_buffer_holds(synthetic):
    det = detector_for(synthetic["dynamic"], max_batch=2)
    with pytest.raises(ValueError, match="exceed"):
        det.preprocess([frame for frame, _ in CASES[:3]])
    det.close()


# -- a real model made dynamic-batch -------------------------------------------------------------
# Which shared models survive the conversion batch-consistently is documented in onnx_models.py:
# static QDQ int8 and fp16 do; the dynamically quantised int8 model does not (per-batch scales).
BATCH_CONSISTENT = ["yolov8n_coco_int8_qdq.onnx", "yolov5n_coco_fp16.onnx"]
REFERENCES = {
    "yolov8n_coco_int8_qdq.onnx": "yolov8n_coco_int8_qdq__{}__conf25_iou45.json",
    "yolov5n_coco_fp16.onnx": "yolov5n_coco_fp16__{}__conf25_iou45.json",
}


@pytest.fixture(scope="module")
def images(media):
    out = [cv2.imread(str(media / name)) for name in ("bus.jpg", "zidane.jpg")]
    assert all(img is not None for img in out)
    return out


@pytest.mark.shared
@pytest.mark.parametrize("model_name", BATCH_CONSISTENT)
def test_real_model_dynamic_copy_batches_like_single_frames(model_name, models, references, images,
                                                            tmp_path, monkeypatch):
    import json

    src = models / model_name
    dst = make_dynamic_batch_copy_of(src, tmp_path / f"dyn_{model_name}")
    det = open_detector(ModelConfig(path=str(dst)), max_batch=2)
    assert det.backend.batch_sizes == (1, 2)

    # Raw outputs: one batch of 2 == two batches of 1. Every scale of the QDQ model is a constant and
    # ONNX Runtime runs each frame of a batch through the same kernels (integer sums are exact in
    # the fused ones), so batching must not move its outputs at all, not even by a quantisation
    # step: compared exactly (bit-identical fused and unfused, 1 to 3 threads, on an AVX-512 VNNI
    # CPU). The fp16 model keeps its 1e-4 relative allowance.
    exact = output_quantisation(dst) is not None
    assert exact == (model_name == "yolov8n_coco_int8_qdq.onnx")
    det.preprocess(images)
    batched = [o.copy() for o in det.backend.run(2)]
    singles = []
    for img in images:
        det.preprocess([img])
        singles.append([o.copy() for o in det.backend.run(1)])
    for k in range(2):
        for b, s in zip(batched, singles[k]):
            if exact:
                np.testing.assert_array_equal(b[k], s[0])
            else:
                np.testing.assert_allclose(b[k].astype(np.float32), s[0].astype(np.float32),
                                           rtol=1e-4, atol=1e-4 * float(np.abs(s[0]).max()))

    # Detections: batch [bus, zidane] in one call == one at a time; and both match the peer, under
    # the parity rule for the model (one quantisation step of the QDQ model's scores, read from the
    # graph: its default fused kernels differ by instruction set; see tests/parity.py).
    calls = CallCounter(monkeypatch, det)
    together = [r.to_dicts(det.labels) for r in det.detect(images)]
    assert calls.batches == [2]
    apart = [det.detect([img])[0].to_dicts(det.labels) for img in images]
    assert together == apart
    for dets, stem in zip(together, ("bus", "zidane")):
        ref = json.loads((references / REFERENCES[model_name].format(stem)).read_text())
        problems = mismatches(dets, ref["detections"], tolerance_for(dst))
        assert not problems, "\n".join(problems)
    det.close()


@pytest.mark.shared
def test_dynamically_quantised_model_runs_frames_one_at_a_time(models, references, images, tmp_path,
                                                               monkeypatch):
    """DynamicQuantizeLinear picks one scale for the whole batch, so batching would make a frame's
    scores depend on its neighbours (up to 0.67 apart here). The backend must notice and run such a
    dynamic-batch model frame by frame: batched results equal single-frame ones and the peer's."""
    import json

    src = models / "yolov8n_coco_int8.onnx"
    dst = make_dynamic_batch_copy_of(src, tmp_path / "dyn_int8.onnx")
    original = open_detector(ModelConfig(path=str(src)), warm_up=False)
    copy = open_detector(ModelConfig(path=str(dst)), max_batch=2, warm_up=False)
    assert copy.backend.batch_sizes == (1,)
    calls = CallCounter(monkeypatch, copy)
    together = copy.detect(images)
    assert calls.batches == [1, 1]
    for img, batched, stem in zip(images, together, ("bus", "zidane")):
        single = original.detect([img])[0]
        np.testing.assert_array_equal(single.boxes, batched.boxes)
        np.testing.assert_array_equal(single.scores, batched.scores)
        ref = json.loads((references / f"yolov8n_coco_int8__{stem}__conf25_iou45.json").read_text())
        problems = mismatches(batched.to_dicts(copy.labels), ref["detections"])
        assert not problems, "\n".join(problems)
    original.close()
    copy.close()

"""Parity with each family's upstream inference code, on every shared model x image x setting and
on the two shared videos frame by frame (references made by Ultralytics, YOLOv5 and YOLOX).

The static QDQ int8 model is compared with one quantisation step of its scores allowed (read from
its graph; tests/parity.py explains the rule), with ONNX Runtime's fused int8 kernels (the default)
and with its unfused float path; the tests at the end show that this tolerance still catches a
colour swap and a letterbox one pixel off.
"""

from __future__ import annotations

import json
import math

import cv2
import numpy as np
import pytest

from parity import STRICT, Tolerance, mismatches, output_quantisation, tolerance_for
from yoloedge.config import ModelConfig
from yoloedge.config.model import OnnxRuntimeConfig
from yoloedge.pipeline.detector import open_detector
from yoloedge.preprocess.letterbox import PAD_VALUE

pytestmark = pytest.mark.shared


def _reference_files(references, kind):
    files = []
    for path in sorted(references.glob("*.json")):
        data = json.loads(path.read_text())
        if ("frames" in data) == (kind == "video"):
            files.append(path)
    return files


def _detector(models, ref, backend_config=None, **extra):
    iou = ref["iou"] if ref["iou"] is not None else 0.45
    return open_detector(ModelConfig(path=str(models / ref["model"]), conf=ref["conf"], iou=iou, **extra),
                         backend_config=backend_config)


def test_every_shared_model_and_image_has_a_reference(models, media, references):
    """Guards the parametrisation below: a new model or image without references is noticed."""
    have = {(p.name.split("__")[0], p.name.split("__")[1]) for p in references.glob("*.json")}
    for model in models.glob("*.onnx"):
        for image in media.glob("*.jpg"):
            assert (model.stem, image.stem) in have, f"no reference for {model.name} x {image.name}"


@pytest.mark.parametrize("ref_name", [
    p.name for p in _reference_files(__import__("conftest").SHARED / "reference", "image")
] if (__import__("conftest").SHARED / "reference").is_dir() else ["missing"])
def test_image_parity(ref_name, models, media, references):
    ref = json.loads((references / ref_name).read_text())
    detector = _detector(models, ref)
    image = cv2.imread(str(media / ref["media"]))
    assert [image.shape[0], image.shape[1]] == ref["image_size"]
    ours = detector.detect([image])[0].to_dicts(detector.labels)
    assert ours, "no detections at all"
    problems = mismatches(ours, ref["detections"], tolerance_for(models / ref["model"]))
    assert not problems, "\n".join(problems)
    assert {d["label"] for d in ours} >= {d["label"] for d in ref["detections"] if d["score"] >= 0.3}


@pytest.mark.parametrize("ref_name", [
    "yolov8n_coco_int8__street_people_720p__conf25_iou45.json",
    "yolov8n_coco_int8__indoor_people_480p_mpeg4__conf25_iou45.json",
])
def test_video_parity_frame_by_frame(ref_name, models, media, references):
    ref = json.loads((references / ref_name).read_text())
    video = next(media.glob(ref["media"]))
    detector = _detector(models, ref)
    tolerance = tolerance_for(models / ref["model"])
    cap = cv2.VideoCapture(str(video))
    failures, index = [], 0
    try:
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            expected = ref["frames"][index]
            assert expected["index"] == index
            ours = detector.detect([frame])[0].to_dicts(detector.labels)
            failures += [f"frame {index}: {p}" for p in mismatches(ours, expected["detections"], tolerance)]
            index += 1
    finally:
        cap.release()
    assert index == len(ref["frames"]), f"decoded {index} frames, reference has {len(ref['frames'])}"
    assert not failures, f"{len(failures)} mismatches:\n" + "\n".join(failures[:20])


# -- the static QDQ model: one quantisation step, read from the graph --------------------------------
QDQ = "yolov8n_coco_int8_qdq.onnx"
FUSION = [pytest.param(True, id="fused"), pytest.param(False, id="unfused")]
_REFS = __import__("conftest").SHARED / "reference"
QDQ_REFS = sorted(p.name for p in _REFS.glob(f"{QDQ[:-5]}__*.json")) if _REFS.is_dir() else ["missing"]
V8_STRIDES = (8, 16, 32)


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_only_the_static_qdq_model_has_requantised_scores(models):
    """The graph decides which rule a model gets: the QDQ model's class rows come out of one
    QuantizeLinear -> DequantizeLinear pair per pyramid level through a Sigmoid, and its box rows out
    of the requantised DFL output times the strides; the fp16, fp32 and dynamically quantised models
    compute their outputs in float and keep the strict rule."""
    seen = set()
    for model in sorted(models.glob("*.onnx")):
        q = output_quantisation(model)
        seen.add(model.name)
        if model.name == QDQ:
            assert q is not None
            assert len(q.logit_steps) == len(V8_STRIDES) and all(s > 0 for s in q.logit_steps)
            assert len(q.box_steps) == 1 and q.box_gain == max(V8_STRIDES)
            assert tolerance_for(model) == Tolerance(logit_step=max(q.logit_steps))
        else:
            assert q is None, f"{model.name}: {q}"
            assert tolerance_for(model) == STRICT
    assert QDQ in seen


@pytest.mark.parametrize("fused", FUSION)
def test_qdq_outputs_lie_on_the_grid_read_from_the_graph(fused, models, media):
    """What the one-step rule rests on: every score the QDQ model outputs is sigmoid(step * n) for a
    logit step read from its graph and an integer n, and every box edge is stride * (anchor -/+
    box_step * n), with ONNX Runtime's fused kernels and without. A step read wrongly from the graph
    puts nearly no value on its grid."""
    q = output_quantisation(models / QDQ)
    det = open_detector(ModelConfig(path=str(models / QDQ)), backend_config=OnnxRuntimeConfig(qdq_fusion=fused))
    h, w = det.input.height, det.input.width
    ax, ay, stride = [], [], []
    for s in V8_STRIDES:
        gy, gx = np.meshgrid(np.arange(h // s) + 0.5, np.arange(w // s) + 0.5, indexing="ij")
        ax.append(gx.ravel())
        ay.append(gy.ravel())
        stride.append(np.full(gx.size, float(s)))
    ax, ay, stride = np.concatenate(ax), np.concatenate(ay), np.concatenate(stride)
    for name in ("bus.jpg", "zidane.jpg"):
        det.preprocess([cv2.imread(str(media / name))])
        out = det.infer(1)[0][0].astype(np.float64)
        assert out.shape[1] == ax.size
        scores = out[4:][(out[4:] > 1e-4) & (out[4:] < 0.999)]  # where float32 still resolves the logit
        assert scores.size > 1000
        logits = np.log(scores / (1 - scores))
        off_grid = np.min([np.abs(logits / st - np.round(logits / st)) for st in q.logit_steps], axis=0)
        # ONNX Runtime's float32 Sigmoid is an approximation (a few 1e-3 steps here); a value off the
        # grid sits anywhere up to half a step from it.
        assert off_grid.max() < 0.02, f"{name}: a score {off_grid.max():.3f} steps off every logit grid"
        cx, cy, bw, bh = out[:4]
        for dist in (ax - (cx - bw / 2) / stride, ay - (cy - bh / 2) / stride,
                     (cx + bw / 2) / stride - ax, (cy + bh / 2) / stride - ay):
            n = dist / q.box_steps[0]
            assert np.abs(n - np.round(n)).max() < 1e-2, f"{name}: a box edge off the grid"
    det.close()


def test_the_qdq_tolerance_admits_one_step_and_not_two(models):
    """On every level's grid, stored scores (6 decimals) one step apart agree and two steps apart do
    not (unless the strict 0.02 already covers them, near 0 and 1); the strict rule alone rejects a
    single step at mid scores, which is why the QDQ model needs the wider rule at all."""
    q = output_quantisation(models / QDQ)
    tol = tolerance_for(models / QDQ)
    checked = 0
    for step in q.logit_steps:
        for n in range(-12, 24):
            a, one, two = (round(_sigmoid(step * (n + k)), 6) for k in (0, 1, 2))
            assert tol.scores_agree(a, one) and tol.scores_agree(one, a), (step, n)
            if abs(two - a) > tol.max_score_diff:
                assert not tol.scores_agree(a, two) and not tol.scores_agree(two, a), (step, n)
                checked += 1
    assert checked > 50
    assert not STRICT.scores_agree(round(_sigmoid(0.0), 6), round(_sigmoid(q.logit_step), 6))


@pytest.mark.parametrize("fused", FUSION)
@pytest.mark.parametrize("ref_name", QDQ_REFS)
def test_qdq_parity_with_and_without_fusion(ref_name, fused, models, media, references):
    """Two correct implementations of the same graph (fused int8 kernels, the float path), one
    rule: both agree with Ultralytics within one step. On an AVX-512 VNNI CPU the fused kernels give
    the references exactly and the float path is one step off on all 5 bus.jpg detections."""
    ref = json.loads((references / ref_name).read_text())
    detector = _detector(models, ref, OnnxRuntimeConfig(qdq_fusion=fused))
    ours = detector.detect([cv2.imread(str(media / ref["media"]))])[0].to_dicts(detector.labels)
    problems = mismatches(ours, ref["detections"], tolerance_for(models / QDQ))
    assert not problems, "\n".join(problems)


def _qdq_parity_problems(models, media, references, stem, fused, **extra):
    ref = json.loads((references / f"{QDQ[:-5]}__{stem}__conf25_iou45.json").read_text())
    detector = _detector(models, ref, OnnxRuntimeConfig(qdq_fusion=fused), **extra)
    image = cv2.imread(str(media / ref["media"]))
    return detector, image, ref


@pytest.mark.parametrize("fused", FUSION)
@pytest.mark.parametrize("stem", ["bus", "zidane"])
def test_qdq_tolerance_still_catches_bgr_input(stem, fused, models, media, references):
    """Feeding the QDQ model BGR instead of RGB fails parity on each shared image, one quantisation
    step allowed or not: on zidane.jpg the tie drops from 0.665 to 0.335 (six steps of its grid) and
    the 0.900 person to 0.772; on bus.jpg the 0.920 person falls two steps to 0.876."""
    tol = tolerance_for(models / QDQ)
    detector, image, ref = _qdq_parity_problems(models, media, references, stem, fused)
    assert not mismatches(detector.detect([image])[0].to_dicts(detector.labels), ref["detections"], tol)
    detector, image, ref = _qdq_parity_problems(models, media, references, stem, fused, color="bgr")
    assert detector.style.rgb is False
    problems = mismatches(detector.detect([image])[0].to_dicts(detector.labels), ref["detections"], tol)
    assert problems, "a colour swap passed the QDQ parity rule"


class _PictureOnePixelLeft:
    """A detector's letterboxer, with the picture then moved one pixel to the left inside the model
    input (the freed column on the right gets the pad value), while the geometry that maps the boxes
    back still says where the letterbox should have put it: a pad split off by one pixel."""

    def __init__(self, inner, pad: float):
        self.inner, self.pad = inner, pad

    def geometry(self, frame):
        return self.inner.geometry(frame)

    def __call__(self, frame, slot):
        geo = self.inner(frame, slot)
        slot[..., :-1] = slot[..., 1:].copy()
        slot[..., -1] = self.pad
        return geo


@pytest.mark.parametrize("fused", FUSION)
@pytest.mark.parametrize("stem", ["bus", "zidane"])
def test_qdq_tolerance_still_catches_a_letterbox_one_pixel_off(stem, fused, models, media, references):
    """A letterbox one pixel off fails parity on each shared image with one quantisation step
    allowed: moving the picture one pixel left moves the bus.jpg person at 0.920 and the zidane.jpg
    tie at 0.665 by two steps of their grids (to 0.876 and 0.758), with either kernel path.

    Not every one-pixel error is visible, to this rule or to any rule that accepts the difference
    between two correct int8 kernels. Measured (fused | unfused, an AVX-512 VNNI CPU), the one-step
    rule flags:

        one-pixel error              bus.jpg          zidane.jpg
        picture 1 px left            yes | yes        yes | yes
        picture 1 px right/up/down   no  | no         no  | no
        resized 1 px narrower        no  | yes        no  | no
        resized 1 px shorter         no  | no         yes | no
        resized 1 px smaller         yes | no         yes | yes

    A one-pixel error moves a box edge by at most one input pixel, which costs at most
    1 - (w-1)/(w+1) of IoU: IoU stays >= 0.94 even for the narrowest shared box (34 input pixels),
    so only the model's response can show the error. The int8 model's response is quantised: most
    scores stay on their grid point or move to the next one, which is also what the fused and the
    unfused kernels differ by. That is the resolution of the int8 model, not a hole the tolerance
    opened: with the strict rule the dynamically quantised v8 misses 1 px down and 1 px narrower on
    bus.jpg and 1 px right and up on zidane.jpg, and YOLOX misses 1 px up and down on bus.jpg and
    1 px down on zidane.jpg (only the fp16 YOLOv5, whose float scores move by many small amounts,
    fails all seven on both images). The picture moved left is the one-pixel error this rule
    catches on both images with both kernels, and it is what this test holds it to; a larger
    placement error is caught by the boxes alone (see the next test)."""
    tol = tolerance_for(models / QDQ)
    detector, image, ref = _qdq_parity_problems(models, media, references, stem, fused)
    assert not mismatches(detector.detect([image])[0].to_dicts(detector.labels), ref["detections"], tol)
    assert detector.style.normalize
    detector.letterbox = _PictureOnePixelLeft(detector.letterbox, PAD_VALUE / 255.0)
    problems = mismatches(detector.detect([image])[0].to_dicts(detector.labels), ref["detections"], tol)
    assert problems, "a letterbox one pixel off passed the QDQ parity rule"


@pytest.mark.parametrize("fused", FUSION)
@pytest.mark.parametrize("stem", ["bus", "zidane"])
def test_qdq_tolerance_keeps_the_box_check_of_the_letterbox_geometry(stem, fused, models, media, references):
    """The tolerance leaves IoU >= 0.90 alone, so a placement error of s input pixels must fail on
    the narrowest reference box (w input pixels) once (w - s') / (w + s') < 0.90, where s' = s - d
    allows for our box already being one box step d (read from the graph, 1.83 input pixels at
    stride 32) off the reference in the opposite direction. Boxes mapped back with a pad s pixels too
    narrow on the left land s pixels to the right (to the left, the bus.jpg person at the image edge
    would be clipped rather than moved); s is the smallest offset for which that bound holds on this
    image (4 on bus.jpg, 5 on zidane.jpg)."""
    import dataclasses

    tol = tolerance_for(models / QDQ)
    d = output_quantisation(models / QDQ).box_step
    detector, image, ref = _qdq_parity_problems(models, media, references, stem, fused)
    geo = detector.letterbox.geometry(image)
    narrowest = min((d["box"][2] - d["box"][0]) * geo.scale_x for d in ref["detections"] if d["score"] >= 0.3)
    s = 1
    while (narrowest - (s - d)) / (narrowest + (s - d)) >= tol.min_iou:
        s += 1
    detector.preprocess([image])
    outputs = detector.infer(1)
    assert not mismatches(detector.postprocess(outputs, [geo])[0].to_dicts(detector.labels), ref["detections"], tol)
    shifted = dataclasses.replace(geo, left=geo.left - s)
    problems = mismatches(detector.postprocess(outputs, [shifted])[0].to_dicts(detector.labels),
                          ref["detections"], tol)
    assert problems, f"boxes {s} px off passed the QDQ parity rule"

"""Check a converted model against its source: the same frames through both, detections compared.

A wrong AIPP block, a swapped colour order or a bad conversion still produces plausible-looking
boxes; only a side-by-side comparison with the ONNX the model came from shows it. This module holds
the agreement rule (shared with the test suite's parity checks, so "agree" means the same thing
everywhere), the per-image comparison, and the hints that turn a disagreement into something to fix.

The rule: every reference detection scoring >= 0.30 needs one of ours with the same class,
IoU >= 0.90 and |score difference| <= 0.02; and none of ours scoring >= 0.30 may be left without a
reference partner under the same rule. Partners below 0.30 count, so a detection that sits right at
the threshold on one side and just under it on the other is not a disagreement.

`Tolerance` holds those numbers. `STRICT` (the default, and what `yoloedge verify` applies) is the
rule above. A model whose scores are the sigmoid of a requantised logit (static QDQ int8) computes
them on a grid; for such a model a caller may also accept scores one grid step apart in logit space
(`Tolerance.logit_step`, the step read from the model's graph): that is what two correct integer
implementations of the same graph (ONNX Runtime's fused kernels per instruction set, its unfused
float path) can differ by.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ImageError
from .redact import redact_value
from .sources.base import SourceError, SourceKind, local_path, source_kind
from .sources.folder import IMAGE_SUFFIXES, list_images
from .sources.imagesize import read_image
from .sources.opening import open_source

MIN_SCORE = 0.30
MIN_IOU = 0.90
MAX_SCORE_DIFF = 0.02
#: stored scores are rounded to 6 decimals (the reference files, the JSON reports): half a unit of
#: that on each side is no disagreement.
SCORE_ROUNDING = 5e-7
#: detections overlapping at least this much (same class) are paired for the diagnostics, even when
#: they miss the rule: a colour swap moves scores by 0.2 but leaves the boxes where they are.
PAIR_IOU = 0.50
#: a mean score shift beyond this is systematic, not precision noise.
SHIFT_SCORE = 0.05

AGREE = "agree"
DISAGREE = "DISAGREE"


def iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two x1, y1, x2, y2 boxes."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    inter = max(w, 0) * max(h, 0)
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))


@dataclass(frozen=True)
class Tolerance:
    """How far two detections of one object may be apart and still agree.

    Scores agree when they differ by at most `max_score_diff`, or, with `logit_step` > 0, when
    their logits differ by at most `logit_step` (plus the 6-decimal rounding of stored scores).
    The second test is for scores that are sigmoid(requantised logit): such scores lie on a grid,
    and `logit_step`, the largest step of the requantisers feeding them, admits the neighbouring
    grid point and nothing beyond it (two steps of the finest requantiser feeding the scores must
    exceed it, which the caller checks). Boxes agree at IoU >= `min_iou`.
    """

    max_score_diff: float = MAX_SCORE_DIFF
    min_iou: float = MIN_IOU
    logit_step: float = 0.0

    def scores_agree(self, a: float, b: float) -> bool:
        if abs(a - b) <= self.max_score_diff:
            return True
        if self.logit_step <= 0:
            return False
        # d logit / d p = 1 / (p (1 - p)): the rounding of either score, seen in logit space.
        slack = sum(SCORE_ROUNDING / max(p * (1.0 - p), 1e-12) for p in (a, b))
        return abs(_logit(a) - _logit(b)) <= self.logit_step + slack


#: the rule of this module's docstring; what `yoloedge verify` reports against.
STRICT = Tolerance()


def partners(x: dict, y: dict, tolerance: Tolerance = STRICT) -> bool:
    """True when two detections agree under the rule (class, IoU, score)."""
    return (x["class_id"] == y["class_id"] and tolerance.scores_agree(x["score"], y["score"])
            and iou(x["box"], y["box"]) >= tolerance.min_iou)


@dataclass(frozen=True)
class Comparison:
    """The rule applied to one image: which detections found a partner and which did not."""

    matched: tuple[tuple[dict, dict], ...]  # (ours, reference), reference scoring >= MIN_SCORE
    missing: tuple[dict, ...]  # reference detections >= MIN_SCORE with none of ours agreeing
    extra: tuple[dict, ...]  # our detections >= MIN_SCORE with no reference partner

    @property
    def agree(self) -> bool:
        return not self.missing and not self.extra

    def problems(self) -> list[str]:
        """One human-readable line per violation, reference misses first."""
        return ([f"reference {ref} has no match among ours" for ref in self.missing]
                + [f"ours {o} has no reference partner" for o in self.extra])


def compare_detections(ours: Sequence[dict], reference: Sequence[dict],
                       tolerance: Tolerance = STRICT) -> Comparison:
    """Apply the agreement rule; detections are dicts with class_id, score and box (x1 y1 x2 y2).

    Each reference detection takes the best-overlapping free one of ours that agrees with it, in
    order of reference score, so one of ours never covers two references.
    """
    matched, missing = [], []
    used: set[int] = set()
    for ref in sorted(reference, key=lambda d: -d["score"]):
        if ref["score"] < MIN_SCORE:
            continue
        candidates = [i for i, o in enumerate(ours) if i not in used and partners(o, ref, tolerance)]
        if not candidates:
            missing.append(ref)
            continue
        best = max(candidates, key=lambda i: iou(ours[i]["box"], ref["box"]))
        used.add(best)
        matched.append((ours[best], ref))
    extra = [o for i, o in enumerate(ours)
             if i not in used and o["score"] >= MIN_SCORE and not any(partners(o, r, tolerance) for r in reference)]
    return Comparison(tuple(matched), tuple(missing), tuple(extra))


# -- diagnostics -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """Our detection and the reference detection it overlaps most (same class, IoU >= PAIR_IOU)."""

    ours: dict
    reference: dict
    iou: float

    @property
    def score_diff(self) -> float:
        """Ours minus reference: negative when the accelerator is less confident."""
        return self.ours["score"] - self.reference["score"]


def pair_detections(ours: Sequence[dict], reference: Sequence[dict], min_iou: float = PAIR_IOU) -> list[Pair]:
    """Greedy one-to-one pairing by overlap, ignoring scores, for measuring how the sides differ."""
    candidates = sorted(
        ((iou(o["box"], r["box"]), i, j) for i, o in enumerate(ours) for j, r in enumerate(reference)
         if o["class_id"] == r["class_id"]),
        key=lambda t: -t[0])
    pairs, used_o, used_r = [], set(), set()
    for overlap, i, j in candidates:
        if overlap < min_iou:
            break
        if i in used_o or j in used_r:
            continue
        used_o.add(i)
        used_r.add(j)
        pairs.append(Pair(ours[i], reference[j], overlap))
    return pairs


def class_swaps(ours: Sequence[dict], reference: Sequence[dict]) -> int:
    """Detections that sit on a reference box (IoU >= MIN_IOU) with another class: a label-order
    or class-count problem rather than a pre-processing one."""
    return sum(1 for o in ours for r in reference
               if o["class_id"] != r["class_id"] and iou(o["box"], r["box"]) >= MIN_IOU
               and min(o["score"], r["score"]) >= MIN_SCORE)


def diagnose(pairs: Sequence[Pair], n_ours: int, n_reference: int, swaps: int = 0) -> list[str]:
    """Likely causes of a disagreement, most telling first; empty when nothing stands out."""
    hints: list[str] = []
    if n_reference and not n_ours:
        return ["the accelerator found nothing where the reference finds "
                f"{n_reference} detection(s): check the AIPP normalisation (var_reci_chn 1/255 for YOLO; "
                "without it the input saturates), the colour order, and model.format (raw head outputs "
                "need format: raw and the anchors)"]
    hints += _score_hints([p.score_diff for p in pairs])
    hints += _box_hints(pairs)
    unpaired_ours, unpaired_ref = n_ours - len(pairs), n_reference - len(pairs)
    if unpaired_ours > max(2, n_reference):
        hints.append(f"the accelerator reports {unpaired_ours} detection(s) with no reference counterpart: "
                     "check model.format (raw head outputs need format: raw and anchors), the AIPP "
                     "normalisation and colour order")
    elif unpaired_ref > max(2, n_ours // 2) and not hints:
        hints.append(f"{unpaired_ref} reference detection(s) have no accelerator counterpart: check the "
                     "AIPP normalisation / colour order, and whether later frames of a dynamic batch "
                     "(padding up to a gear) lose detections")
    if swaps and not hints:
        hints.append(f"{swaps} box(es) agree but carry another class: check the labels file and the "
                     "model's class order (model.labels)")
    return hints


def _score_hints(diffs: Sequence[float]) -> list[str]:
    if not diffs:
        return []
    mean = float(np.mean(diffs))
    worst = float(np.max(np.abs(diffs)))
    if mean <= -SHIFT_SCORE:
        return [f"scores lower by {-mean:.2f} on average: check the AIPP normalisation "
                "(mean/min_chn, var_reci_chn) and the colour order (model.color, rbuv_swap_switch)"]
    if mean >= SHIFT_SCORE:
        return [f"scores higher by {mean:.2f} on average: check the AIPP normalisation "
                "(mean/min_chn, var_reci_chn) and the colour order (model.color, rbuv_swap_switch)"]
    if worst > MAX_SCORE_DIFF:
        both = min(diffs) < -MAX_SCORE_DIFF and max(diffs) > MAX_SCORE_DIFF
        return [f"scores differ by up to {worst:.2f}{' in both directions' if both else ''} "
                f"(mean {mean:+.3f}): check the colour order (model.color, rbuv_swap_switch) and the "
                "normalisation; differences of a few hundredths alone can come from FP16 arithmetic "
                "on the NPU/GPU or an INT8 conversion (trtexec --fp16/--int8)"]
    return []


def _box_hints(pairs: Sequence[Pair]) -> list[str]:
    ious = [p.iou for p in pairs]
    if not ious or float(np.mean(ious)) >= MIN_IOU:
        return []
    o = np.array([p.ours["box"] for p in pairs], np.float64)
    r = np.array([p.reference["box"] for p in pairs], np.float64)
    ratio = float(np.mean((o[:, 2] - o[:, 0]) * (o[:, 3] - o[:, 1]))
                  / max(np.mean((r[:, 2] - r[:, 0]) * (r[:, 3] - r[:, 1])), 1e-9)) ** 0.5
    dx = float(np.mean((o[:, 0] + o[:, 2] - r[:, 0] - r[:, 2]) / 2))
    dy = float(np.mean((o[:, 1] + o[:, 3] - r[:, 1] - r[:, 3]) / 2))
    hints = [f"boxes overlap their reference by IoU {float(np.mean(ious)):.2f} on average"]
    if abs(ratio - 1) > 0.05:
        hints[0] += f", {ratio:.2f}x the reference size: check imgsz (the model input size) and the letterbox"
    elif abs(dx) > 2 or abs(dy) > 2:
        hints[0] += (f", shifted by ({dx:+.0f}, {dy:+.0f}) px: check the letterbox placement "
                     "(model.letterbox center | topleft)")
    else:
        hints[0] += ": check imgsz, the letterbox and model.format"
    return hints


# -- reports -----------------------------------------------------------------------------------

@dataclass
class ImageResult:
    """One frame through both sides."""

    image: str
    width: int
    height: int
    ours: list[dict]
    reference: list[dict]
    comparison: Comparison = field(init=False)
    pairs: list[Pair] = field(init=False)

    def __post_init__(self) -> None:
        self.comparison = compare_detections(self.ours, self.reference)
        self.pairs = pair_detections(self.ours, self.reference)

    @property
    def verdict(self) -> str:
        return AGREE if self.comparison.agree else DISAGREE

    def hints(self) -> list[str]:
        if self.comparison.agree:
            return []
        return diagnose(self.pairs, len(self.ours), len(self.reference), class_swaps(self.ours, self.reference))

    def to_dict(self) -> dict:
        worst_iou = min((p.iou for p in self.pairs), default=None)
        worst_diff = max((abs(p.score_diff) for p in self.pairs), default=None)
        return {
            "image": self.image,
            "width": self.width,
            "height": self.height,
            "verdict": self.verdict,
            "accelerator_detections": len(self.ours),
            "reference_detections": len(self.reference),
            "matched": len(self.comparison.matched),
            "paired": len(self.pairs),
            "worst_iou": None if worst_iou is None else round(worst_iou, 4),
            "worst_score_diff": None if worst_diff is None else round(worst_diff, 4),
            "mean_score_diff": (round(float(np.mean([p.score_diff for p in self.pairs])), 4)
                                if self.pairs else None),
            "missing_on_accelerator": list(self.comparison.missing),
            "extra_on_accelerator": list(self.comparison.extra),
            "hints": self.hints(),
        }


@dataclass
class Report:
    """Every image's result plus what the two sides were, for the text and JSON output."""

    accelerator: dict
    reference: dict
    results: list[ImageResult] = field(default_factory=list)
    #: hints that do not come from the detections (e.g. differing pre-processing settings).
    notes: list[str] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return all(r.comparison.agree for r in self.results)

    def overall_hints(self) -> list[str]:
        """Diagnosis over all images together: a systematic shift shows better across many."""
        bad = [r for r in self.results if not r.comparison.agree]
        if not bad:
            return []
        pairs = [p for r in self.results for p in r.pairs]
        hints = diagnose(pairs, sum(len(r.ours) for r in self.results),
                         sum(len(r.reference) for r in self.results),
                         sum(class_swaps(r.ours, r.reference) for r in self.results))
        return self.notes + hints

    def to_dict(self) -> dict:
        disagree = sum(1 for r in self.results if not r.comparison.agree)
        return {
            "verdict": AGREE if self.agree else DISAGREE,
            "images": len(self.results),
            "agree": len(self.results) - disagree,
            "disagree": disagree,
            "rule": {"min_score": MIN_SCORE, "min_iou": MIN_IOU, "max_score_diff": MAX_SCORE_DIFF},
            "accelerator": self.accelerator,
            "reference": self.reference,
            "results": [r.to_dict() for r in self.results],
            "hints": self.overall_hints(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_text(self) -> str:
        lines = [f"accelerator: {self.accelerator['name']} ({self.accelerator['description']}) "
                 f"on {self.accelerator['model']}",
                 f"reference:   {self.reference['description']} on {self.reference['model']}",
                 f"rule: same class, IoU >= {MIN_IOU:.2f}, |score difference| <= {MAX_SCORE_DIFF:.2f} "
                 f"for every detection scoring >= {MIN_SCORE:.2f}", ""]
        for r in self.results:
            lines += _image_lines(r.to_dict())
        d = self.to_dict()
        lines.append("")
        lines.append(f"overall: {d['verdict']} ({d['agree']} of {d['images']} image(s) agree)")
        lines += [f"  hint: {h}" for h in d["hints"]]
        return "\n".join(lines) + "\n"


def _image_lines(d: dict) -> list[str]:
    worst_iou = "-" if d["worst_iou"] is None else f"{d['worst_iou']:.3f}"
    worst_diff = "-" if d["worst_score_diff"] is None else f"{d['worst_score_diff']:.3f}"
    lines = [f"{d['verdict']:<8}  {d['image']}: accelerator {d['accelerator_detections']}, "
             f"reference {d['reference_detections']}, matched {d['matched']}, "
             f"worst IoU {worst_iou}, worst |score diff| {worst_diff}"]
    for det in d["missing_on_accelerator"]:
        lines.append(f"          missing on the accelerator: {_describe(det)}")
    for det in d["extra_on_accelerator"]:
        lines.append(f"          extra on the accelerator:   {_describe(det)}")
    lines += [f"          hint: {h}" for h in d["hints"]]
    return lines


def _describe(det: dict) -> str:
    box = ", ".join(f"{v:.0f}" for v in det["box"])
    return f"{det.get('label', det['class_id'])} {det['score']:.2f} [{box}]"


def style_notes(ours, reference, host_normalises: bool = True) -> list[str]:
    """Notes for pre-processing that differs between the sides (two `LetterboxStyle`s).

    The reference runs the ONNX the way its family was trained; a config override on the
    accelerator side (model.color, model.letterbox, model.normalize) is the first suspect when the
    two disagree, unless the model really was trained that way. `host_normalises` is False when
    the accelerator takes uint8 frames (AIPP normalises on the chip, model.normalize does not apply).
    """
    notes = []
    if ours.rgb != reference.rgb:
        mine, theirs = ("rgb", "bgr") if ours.rgb else ("bgr", "rgb")
        if host_normalises:
            notes.append(f"the accelerator side feeds {mine.upper()} (model.color), the reference {theirs.upper()} "
                         f"(the model family's default): fix model.color, or pass --source-color {mine} if "
                         f"the model was trained on {mine.upper()}")
        else:
            notes.append(f"the accelerator side sends {mine.upper()} frames to the AIPP (model.color), the "
                         f"reference feeds the model {theirs.upper()}: right only if the .om's AIPP swaps R and B "
                         f"(rbuv_swap_switch: true, `yoloedge convert atc --frame-color {mine}`)")
    if ours.placement != reference.placement:
        notes.append(f"the accelerator side letterboxes {ours.placement} (model.letterbox), the reference "
                     f"{reference.placement}: fix model.letterbox, or pass --source-letterbox {ours.placement}")
    if host_normalises and ours.normalize != reference.normalize:
        flag = "--source-normalize" if ours.normalize else "--no-source-normalize"
        notes.append(f"the accelerator side {'divides' if ours.normalize else 'does not divide'} pixels by 255 "
                     f"(model.normalize), the reference {'does' if reference.normalize else 'does not'}: "
                     f"fix model.normalize, or pass {flag}")
    return notes


# -- running both sides ------------------------------------------------------------------------

def run_both(accelerator, reference, frames: Sequence[tuple[str, np.ndarray]]) -> list[ImageResult]:
    """Detect every frame on both detectors; the accelerator in batches of its own size, as the
    daemon runs it (so dynamic-batch gears and padding are exercised), the reference one by one."""
    results = []
    step = max(accelerator.max_batch, 1)
    for start in range(0, len(frames), step):
        chunk = frames[start:start + step]
        ours = accelerator.detect([img for _, img in chunk])
        for (name, img), dets in zip(chunk, ours):
            ref = reference.detect([img])[0]
            results.append(ImageResult(name, int(img.shape[1]), int(img.shape[0]),
                                       dets.to_dicts(accelerator.labels), ref.to_dicts(reference.labels)))
    return results


# -- frames ------------------------------------------------------------------------------------

@dataclass
class Frames:
    """Named frames to verify on, and the inputs that could not be read (each a message)."""

    frames: list[tuple[str, np.ndarray]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: live cameras passed over: a verification must be repeatable, a live stream is not.
    skipped: list[str] = field(default_factory=list)


def read_inputs(paths: Sequence[str], frames_per_video: int) -> Frames:
    """Images, folders of images and video files (their first `frames_per_video` frames)."""
    out = Frames()
    for arg in paths:
        p = Path(arg)
        if p.is_dir():
            files = list_images(arg)
            if not files:
                out.problems.append(f"no images in folder {arg}")
            for f in files:
                _read_image(f, out)
        elif not p.exists():
            out.problems.append(f"not found: {redact_value(arg)}")  # maybe a camera URL, password and all
        elif p.suffix.lower() in IMAGE_SUFFIXES:
            _read_image(arg, out)
        else:
            _read_video(arg, arg, frames_per_video, out)
    return out


def camera_inputs(cameras: Sequence, frames_per_camera: int) -> Frames:
    """The first frames of every enabled camera that reads a file or a folder."""
    out = Frames()
    for cam in cameras:
        if not cam.enabled:
            continue
        if cam.pipeline:
            out.skipped.append(f"{cam.name}: a pipeline: camera (give the files to verify as arguments)")
            continue
        try:
            kind = source_kind(cam.url)
        except SourceError as exc:
            out.skipped.append(f"{cam.name}: {exc}")
            continue
        if kind not in (SourceKind.FILE, SourceKind.FOLDER):
            out.skipped.append(f"{cam.name}: a live source ({kind.value})")
            continue
        if not os.path.exists(local_path(cam.url)):
            out.problems.append(f"camera {cam.name}: not found: {redact_value(local_path(cam.url))}")
            continue
        _read_video(local_path(cam.url), f"{cam.name}", frames_per_camera, out)
    return out


def _read_image(path: str, out: Frames) -> None:
    try:
        out.frames.append((path, read_image(path)))
    except ImageError as exc:
        out.problems.append(str(exc))


def _read_video(path: str, name: str, count: int, out: Frames) -> None:
    """First `count` frames of a video file or image folder, named name#index."""
    try:
        source = open_source(path, loop=False)
    except SourceError as exc:
        out.problems.append(str(exc))
        return
    try:
        read = 0
        while read < count:
            image = source.read()
            if image is None:
                break
            out.frames.append((f"{name}#{read}", image))
            read += 1
        if read == 0:
            out.problems.append(source.error or f"{path}: no frame could be read")
    finally:
        source.release()

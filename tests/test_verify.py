"""`yoloedge verify`: the agreement rule, the diagnostics, and the command on the shared models.

The accelerator side of most tests is ONNX Runtime itself (the only runtime here); an AIPP-style
accelerator is simulated by `AippOnnxBackend` below, which takes uint8 NHWC frames and applies an
aipp.cfg by ATC's documented formula before running the ONNX. That ties the two halves of the
conversion story together: the aipp.cfg `yoloedge convert atc` writes must make such an accelerator
agree with the source ONNX, and a wrong one must be caught with a useful hint.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from parity import mismatches
from yoloedge.backends.base import Backend
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend
from yoloedge.cli.main import build_parser
from yoloedge.convert.aipp import AippSettings, aipp_config
from yoloedge.model.spec import ModelSpec, TensorSpec
from yoloedge.preprocess import LetterboxStyle
from yoloedge.verify import (AGREE, DISAGREE, Pair, compare_detections, diagnose, pair_detections, read_inputs,
                             style_notes)

V8 = "yolov8n_coco_int8.onnx"


def det(cls, score, box, label=None):
    return {"label": label or f"c{cls}", "class_id": cls, "score": score, "box": list(box)}


# -- the rule ----------------------------------------------------------------------------------

def test_compare_agrees_within_the_rule():
    ref = [det(0, 0.80, (10, 10, 110, 110)), det(1, 0.31, (200, 200, 260, 260))]
    ours = [det(0, 0.79, (11, 10, 111, 110)), det(1, 0.32, (200, 200, 260, 261))]
    result = compare_detections(ours, ref)
    assert result.agree and len(result.matched) == 2 and result.problems() == []


def test_compare_reports_missing_and_extra():
    ref = [det(0, 0.80, (10, 10, 110, 110))]
    ours = [det(0, 0.70, (10, 10, 110, 110)), det(2, 0.50, (300, 300, 400, 400))]
    result = compare_detections(ours, ref)
    assert not result.agree
    assert result.missing == (ref[0],)
    assert set(map(id, result.extra)) == {id(ours[0]), id(ours[1])}
    assert mismatches(ours, ref) == result.problems()
    assert result.problems()[0].startswith("reference ") and result.problems()[-1].startswith("ours ")


def test_compare_partner_below_threshold_counts():
    """0.31 on one side, 0.295 on the other: within 0.02, so neither is an error."""
    ref = [det(0, 0.295, (10, 10, 110, 110))]
    ours = [det(0, 0.31, (10, 10, 110, 110))]
    assert compare_detections(ours, ref).agree
    assert compare_detections(ref, ours).agree


def test_compare_class_and_overlap_matter():
    ref = [det(0, 0.80, (10, 10, 110, 110))]
    assert not compare_detections([det(1, 0.80, (10, 10, 110, 110))], ref).agree
    assert not compare_detections([det(0, 0.80, (20, 20, 120, 120))], ref).agree


def test_one_of_ours_covers_one_reference_only():
    ref = [det(0, 0.80, (10, 10, 110, 110)), det(0, 0.79, (10, 10, 110, 111))]
    ours = [det(0, 0.80, (10, 10, 110, 110))]
    result = compare_detections(ours, ref)
    assert len(result.matched) == 1 and len(result.missing) == 1


# -- diagnostics -------------------------------------------------------------------------------

def test_pairs_ignore_scores_but_not_classes():
    ref = [det(0, 0.80, (10, 10, 110, 110)), det(1, 0.60, (200, 200, 300, 300))]
    ours = [det(0, 0.50, (12, 10, 112, 110)), det(2, 0.60, (200, 200, 300, 300))]
    pairs = pair_detections(ours, ref)
    assert len(pairs) == 1 and pairs[0].reference is ref[0]
    assert pairs[0].score_diff == pytest.approx(-0.30)


def test_hint_for_lower_scores_names_normalisation_and_colour():
    pairs = [Pair(det(0, 0.5, (0, 0, 10, 10)), det(0, 0.8, (0, 0, 10, 10)), 1.0)] * 3
    hints = diagnose(pairs, 3, 3)
    assert len(hints) == 1 and "scores lower by 0.30" in hints[0]
    assert "normalisation" in hints[0] and "colour" in hints[0]


def test_hint_when_the_accelerator_finds_nothing():
    hints = diagnose([], 0, 4)
    assert "found nothing" in hints[0] and "AIPP" in hints[0] and "format: raw" in hints[0]


def test_hint_for_shifted_boxes_names_the_letterbox():
    pairs = [Pair(det(0, 0.8, (30, 10, 130, 110)), det(0, 0.8, (10, 10, 110, 110)), 0.67)]
    hints = diagnose(pairs, 1, 1)
    assert any("shifted by (+20, +0) px" in h and "letterbox" in h for h in hints)


def test_hint_for_scaled_boxes_names_imgsz():
    pairs = [Pair(det(0, 0.8, (10, 10, 80, 80)), det(0, 0.8, (10, 10, 110, 110)), 0.49)]
    assert any("imgsz" in h for h in diagnose(pairs, 1, 1))


def test_hint_for_swapped_classes():
    assert any("labels" in h for h in diagnose([], 2, 2, swaps=2))


def test_style_notes():
    ref = LetterboxStyle(placement="center", rgb=True, normalize=True)
    assert style_notes(ref, ref) == []
    bgr = LetterboxStyle(placement="center", rgb=False, normalize=True)
    assert "--source-color bgr" in style_notes(bgr, ref)[0]
    assert "rbuv_swap_switch" in style_notes(bgr, ref, host_normalises=False)[0]
    raw = LetterboxStyle(placement="topleft", rgb=True, normalize=False)
    notes = style_notes(raw, ref)
    assert any("model.letterbox" in n for n in notes) and any("model.normalize" in n for n in notes)
    assert not any("normalize" in n for n in style_notes(raw, ref, host_normalises=False))


def test_read_inputs_reports_every_missing_input(tmp_path):
    frames = read_inputs([str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")], 5)
    assert frames.frames == [] and len(frames.problems) == 2


# -- an AIPP-style accelerator, simulated ------------------------------------------------------

def parse_aipp(path: str) -> dict[str, str]:
    fields = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


class AippOnnxBackend(Backend):
    """uint8 NHWC frames in; the aipp.cfg named in the options applied by ATC's formula
    (swap R/B, then out = (in - mean_chn - min_chn) * var_reci_chn); then the float ONNX."""

    name = "aipp-onnx"

    def __init__(self, model_path: str, options=None):
        options = dict(options or {})
        self.aipp = parse_aipp(options["aipp_cfg"])
        self.inner = OnnxRuntimeBackend(model_path)
        self._bufs: list[np.ndarray] = []

    def open(self, max_batch: int = 1, input_hw=None, *, input_sets: int = 1, output_sets: int = 1) -> ModelSpec:
        spec = self.inner.open(max_batch, input_hw, output_sets=output_sets)
        n, c, h, w = spec.input.shape
        if (int(self.aipp["src_image_size_w"]), int(self.aipp["src_image_size_h"])) != (w, h):
            raise ValueError("aipp.cfg image size differs from the model input")
        self._bufs = [np.zeros((n, h, w, c), np.uint8) for _ in range(input_sets)]
        return ModelSpec(spec.path, (TensorSpec(spec.input.name, (n, h, w, c), np.dtype(np.uint8)),),
                         spec.outputs, spec.metadata)

    @property
    def input_buffers(self) -> list[np.ndarray]:
        return self._bufs

    @property
    def max_batch(self) -> int:
        return self.inner.max_batch

    def run(self, n: int, input_set: int = 0, output_set: int = 0):
        x = self._bufs[input_set][:n].astype(np.float32)
        if self.aipp["rbuv_swap_switch"] == "true":
            x = x[..., ::-1]
        for i in range(3):
            x[..., i] = ((x[..., i] - float(self.aipp[f"mean_chn_{i}"]) - float(self.aipp[f"min_chn_{i}"]))
                         * float(self.aipp[f"var_reci_chn_{i}"]))
        self.inner.input_buffer[:n] = x.transpose(0, 3, 1, 2)
        return self.inner.run(n, 0, output_set)

    def close(self) -> None:
        self.inner.close()


# -- the command -------------------------------------------------------------------------------

def write_config(tmp_path: Path, model: Path, extra_model: str = "", accelerators: str = "",
                 cameras: str = "", name: str = "yoloedge.yaml") -> Path:
    text = f"device_id: test\nmodel:\n  path: {model}\n"
    text += textwrap.indent(textwrap.dedent(extra_model), "  ")
    text += textwrap.dedent(accelerators) + textwrap.dedent(cameras)
    path = tmp_path / name
    path.write_text(text)
    return path


def verify(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "yoloedge", "verify", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)


def verify_here(*args) -> tuple[int, str, str]:
    """In-process (so the simulated backend in this module is importable by name)."""
    parsed = build_parser().parse_args(["verify", *map(str, args)])
    out, err = io.StringIO(), io.StringIO()
    code = parsed.func(parsed, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def images(media):
    return [media / "bus.jpg", media / "zidane.jpg"]


@pytest.mark.shared
def test_v8_against_itself_agrees(models, images, tmp_path):
    config = write_config(tmp_path, models / V8)
    proc = verify("-c", config, "--images", *images)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count(f"{AGREE}  ") == 2
    assert "overall: agree (2 of 2 image(s) agree)" in proc.stdout


@pytest.mark.shared
def test_swapped_colour_order_disagrees_with_a_hint(models, images, tmp_path):
    config = write_config(tmp_path, models / V8, extra_model="color: bgr\n")
    proc = verify("-c", config, "--onnx", models / V8, "--images", *images)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert DISAGREE in proc.stdout and "overall: DISAGREE" in proc.stdout
    overall = proc.stdout.split("overall:")[1]
    assert "colour order" in overall and "normalisation" in overall
    assert "model.color" in overall


@pytest.mark.shared
def test_json_report_structure(models, images, tmp_path):
    config = write_config(tmp_path, models / V8, extra_model="color: bgr\n")
    proc = verify("-c", config, "--images", *images, "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) == {"verdict", "images", "agree", "disagree", "rule", "accelerator", "reference",
                           "results", "hints"}
    assert report["verdict"] == DISAGREE and report["images"] == 2
    assert report["agree"] + report["disagree"] == 2 and report["disagree"] >= 1
    assert report["rule"] == {"min_score": 0.3, "min_iou": 0.9, "max_score_diff": 0.02}
    assert report["accelerator"]["backend"] == "onnxruntime" and report["accelerator"]["name"] == "onnxruntime0"
    assert report["reference"]["model"] == str(models / V8)
    for result in report["results"]:
        assert set(result) == {"image", "width", "height", "verdict", "accelerator_detections",
                               "reference_detections", "matched", "paired", "worst_iou", "worst_score_diff",
                               "mean_score_diff", "missing_on_accelerator", "extra_on_accelerator", "hints"}
        assert result["verdict"] in (AGREE, DISAGREE)
        for d in result["missing_on_accelerator"] + result["extra_on_accelerator"]:
            assert set(d) >= {"label", "class_id", "score", "box"}
    bus = report["results"][0]
    assert bus["image"] == str(images[0]) and (bus["width"], bus["height"]) == (810, 1080)
    assert any("colour" in h for h in report["hints"])


@pytest.mark.shared
def test_missing_images_exit_2(models, tmp_path, media):
    config = write_config(tmp_path, models / V8)
    proc = verify("-c", config, "--images", media / "bus.jpg", tmp_path / "nope.jpg")
    assert proc.returncode == 2
    assert "nope.jpg" in proc.stderr and proc.stdout == ""


def test_config_error_exit_78(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("device_id: test\nmodel:\n  path: /nonexistent/model.onnx\n")
    proc = verify("-c", config, "--images", tmp_path)
    assert proc.returncode == 78
    assert "model" in proc.stderr


@pytest.mark.shared
def test_no_images_and_no_file_cameras_exit_2(models, tmp_path):
    config = write_config(tmp_path, models / V8, cameras="cameras:\n  - name: gate\n    url: rtsp://10.0.0.9/live\n")
    proc = verify("-c", config)
    assert proc.returncode == 2 and "--images" in proc.stderr
    assert "gate: a live source (rtsp)" in proc.stderr


@pytest.mark.shared
def test_frames_from_file_cameras(models, media, tmp_path):
    config = write_config(tmp_path, models / V8, cameras=f"""\
        cameras:
          - name: lobby
            url: {media / 'indoor_people_480p_mpeg4.avi'}
          - name: gate
            url: rtsp://10.0.0.9/live
        """)
    proc = verify("-c", config, "--frames", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [r["image"] for r in report["results"]] == ["lobby#0", "lobby#1"]
    assert "skipped camera gate" in proc.stderr


@pytest.mark.shared
def test_non_onnx_model_without_source_exit_2(models, tmp_path):
    om = tmp_path / "yolov8n.om"
    shutil.copy(models / V8, om)
    aipp = tmp_path / "yolov8n.aipp.cfg"
    aipp.write_text(aipp_config(AippSettings(640, 640)))
    config = write_config(tmp_path, om, extra_model="input: aipp\n", accelerators=f"""\
        accelerators:
          - backend: test_verify:AippOnnxBackend
            options: {{aipp_cfg: {aipp}}}
        """)
    code, out, err = verify_here("-c", config, "--images", models.parent / "media" / "bus.jpg")
    assert code == 2 and "--onnx" in err and "source_onnx" in err


@pytest.mark.shared
def test_generated_aipp_makes_the_accelerator_agree(models, images, tmp_path):
    """The aipp.cfg `convert atc` writes for YOLO, applied by ATC's formula, reproduces the ONNX."""
    aipp = tmp_path / "yolov8n.aipp.cfg"
    aipp.write_text(aipp_config(AippSettings(640, 640)))
    shutil.copy(models / V8, tmp_path / "source.onnx")
    config = write_config(tmp_path, models / V8, extra_model="input: aipp\n", accelerators=f"""\
        accelerators:
          - backend: test_verify:AippOnnxBackend
            options: {{aipp_cfg: {aipp}, source_onnx: source.onnx}}
        """)
    code, out, err = verify_here("-c", config, "--images", *images)
    assert code == 0, out + err
    assert f"on {tmp_path / 'source.onnx'}" in out  # source_onnx is taken relative to the config file


@pytest.mark.shared
@pytest.mark.parametrize("settings, words", [
    (AippSettings(640, 640, frame_color="bgr"), ("colour order", "rbuv_swap_switch")),  # swaps RGB frames
    (AippSettings(640, 640, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), ("normalisation",)),
])
def test_wrong_aipp_is_caught(models, images, tmp_path, settings, words):
    aipp = tmp_path / "wrong.aipp.cfg"
    aipp.write_text(aipp_config(settings))
    config = write_config(tmp_path, models / V8, extra_model="input: aipp\n", accelerators=f"""\
        accelerators:
          - backend: test_verify:AippOnnxBackend
            options: {{aipp_cfg: {aipp}}}
        """)
    code, out, err = verify_here("-c", config, "--onnx", models / V8, "--images", *images)
    assert code == 1, out + err
    overall = out.split("overall:")[1]
    assert "DISAGREE" in overall
    for word in words:
        assert word in overall, overall


# -- TensorRT, through the fake tensorrt and cuda-python in tests/fakes ------------------------------

def fake_trt_engine(monkeypatch, directory: Path, onnx: Path) -> Path:
    """A fake engine of `onnx` (tests/fakes/tensorrt), with the fakes importable for this test."""
    monkeypatch.syspath_prepend(str(REPO / "tests" / "fakes"))
    from tensorrt import _fake as trt_fake

    if not hasattr(trt_fake, "write_engine"):
        pytest.skip("the real TensorRT is imported in this process")
    trt_fake.reset("10.3.0")
    return Path(trt_fake.write_engine(directory / "yolov8n.engine", onnx, profile=(1, 2, 2), version="10.3"))


@pytest.mark.shared
def test_tensorrt_engine_agrees_with_its_source_onnx(models, images, tmp_path, monkeypatch):
    shutil.copy(models / V8, tmp_path / "source.onnx")
    engine = fake_trt_engine(monkeypatch, tmp_path, tmp_path / "source.onnx")
    config = write_config(tmp_path, engine, accelerators="""\
        accelerators:
          - backend: tensorrt
            batch: 2
            tensorrt: {source_onnx: source.onnx}
        """)
    code, out, err = verify_here("-c", config, "--images", *images)
    assert code == 0, out + err
    assert "tensorrt 10.3.0 GPU 0" in out and f"on {tmp_path / 'source.onnx'}" in out
    assert "overall: agree (2 of 2 image(s) agree)" in out


@pytest.mark.shared
def test_tensorrt_engine_with_the_wrong_colour_order_is_caught(models, images, tmp_path, monkeypatch):
    engine = fake_trt_engine(monkeypatch, tmp_path, models / V8)
    config = write_config(tmp_path, engine, extra_model="color: bgr\n", accelerators=f"""\
        accelerators:
          - backend: tensorrt
            tensorrt: {{source_onnx: {models / V8}}}
        """)
    code, out, err = verify_here("-c", config, "--images", *images)
    assert code == 1, out + err
    assert "DISAGREE" in out.split("overall:")[1] and "colour order" in out


@pytest.mark.shared
def test_tensorrt_engine_without_source_onnx_says_where_to_set_it(models, images, tmp_path, monkeypatch):
    engine = fake_trt_engine(monkeypatch, tmp_path, models / V8)
    config = write_config(tmp_path, engine, accelerators="""\
        accelerators:
          - backend: tensorrt
        """)
    code, out, err = verify_here("-c", config, "--images", *images)
    assert code == 2 and "--onnx" in err and "source_onnx in the tensorrt section" in err


def test_verify_skips_a_pipeline_camera_instead_of_calling_it_missing():
    from yoloedge.config import CameraConfig
    from yoloedge.verify import camera_inputs

    camera = CameraConfig(name="gate", url="", pipeline="videotestsrc num-buffers=3 ! videoconvert ! appsink",
                          decoder="gstreamer")
    out = camera_inputs([camera], 2)
    assert out.problems == [] and out.frames == []
    assert out.skipped == ["gate: a pipeline: camera (give the files to verify as arguments)"]

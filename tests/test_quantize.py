"""`yoloedge quantize`: the INT8 model, the agreement report, the TensorRT table, AMCT's input.

One real quantization (YOLOX-nano, the corpus's one float32 COCO model, 416x416) on a few frames
of a real video serves every test of the output; the matcher and the AP are checked on hand-made
boxes whose answers are worked out in the comments. Speed is reported, never asserted.
"""

from __future__ import annotations

import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from yoloedge.cli.main import main
from yoloedge.cli.quantize import format_report
from yoloedge.quantize.agreement import Boxes, agreement, all_point_ap
from yoloedge.quantize.calibrate import tensorrt_table, trt_scale_hex
from yoloedge.quantize.frames import split, spread

MODEL = "yolox_nano_coco_416.onnx"
VIDEO = "indoor_people_480p_mpeg4.avi"  # 84 frames, 640x480
CALIB_FRAMES = 4


# -- the matcher and the AP, on boxes with known answers ------------------------------------------

A = [10, 10, 50, 50]
B = [100, 100, 160, 180]
C = [200, 20, 260, 90]
D = [300, 300, 340, 400]


def frame(*objects) -> Boxes:
    """objects: (class_id, box, score)."""
    if not objects:
        return Boxes.of(np.zeros((0, 4)), [], [])
    return Boxes.of([o[1] for o in objects], [o[2] for o in objects], [o[0] for o in objects])


def shifted(box, dx):
    return [box[0] + dx, box[1], box[2] + dx, box[3]]


def test_perfect_agreement_is_one():
    truth = [frame((0, A, 0.9), (0, B, 0.8)), frame((2, C, 0.7))]
    r = agreement(truth, truth)
    assert (r.precision, r.recall, r.map50) == (1.0, 1.0, 1.0)
    assert (r.true_positives, r.predictions, r.truths) == (3, 3, 3)


def test_one_missed_box_of_four():
    truth = [frame((0, A, 1), (0, B, 1)), frame((0, C, 1), (0, D, 1))]
    pred = [frame((0, A, 0.9), (0, B, 0.8)), frame((0, C, 0.7))]
    r = agreement(pred, truth)
    # 3 of 4 found, none wrong; the curve stops at recall 3/4 with precision 1: AP = 0.75
    assert r.recall == pytest.approx(0.75)
    assert r.precision == 1.0
    assert r.map50 == pytest.approx(0.75)


def test_a_false_positive_scored_highest_costs_ap():
    truth = [frame((0, A, 1), (0, B, 1), (0, C, 1), (0, D, 1))]
    pred = [frame((0, [500, 500, 520, 520], 0.99), (0, A, 0.9), (0, B, 0.8), (0, C, 0.7), (0, D, 0.6))]
    r = agreement(pred, truth)
    # hits F T T T T: precision 0, 1/2, 2/3, 3/4, 4/5 at recall 0, .25, .5, .75, 1; interpolated from
    # the right every recall step has precision 4/5, so AP = 0.8
    assert r.precision == pytest.approx(0.8)
    assert r.recall == 1.0
    assert r.map50 == pytest.approx(0.8)


def test_a_false_positive_scored_lowest_keeps_ap():
    truth = [frame((0, A, 1), (0, B, 1))]
    pred = [frame((0, A, 0.9), (0, B, 0.8), (0, C, 0.1))]
    r = agreement(pred, truth)
    assert r.precision == pytest.approx(2 / 3)
    assert r.map50 == 1.0


def test_iou_below_half_wrong_class_and_duplicates_are_false_positives():
    truth = [frame((0, A, 1), (1, B, 1), (2, C, 1))]
    # A shifted by 20 of its 40 px: IoU 20*40 / (2*1600 - 800) = 1/3; B named class 3; C twice
    pred = [frame((0, shifted(A, 20), 0.9), (3, B, 0.9), (2, C, 0.8), (2, shifted(C, 1), 0.7))]
    r = agreement(pred, truth)
    assert r.true_positives == 1
    assert r.precision == pytest.approx(1 / 4)
    assert r.recall == pytest.approx(1 / 3)
    # class 0: AP 0; class 1: no prediction, AP 0; class 2: T then F, AP 1; class 3 has no truth
    assert r.ap_per_class == {0: 0.0, 1: 0.0, 2: 1.0}
    assert r.map50 == pytest.approx(1 / 3)


def test_iou_at_exactly_half_matches():
    # B is 60x80; shifted by 20 px: overlap 40*80 = 3200, union 2*4800 - 3200 = 6400: IoU 0.5
    r = agreement([frame((0, shifted(B, 20), 0.9))], [frame((0, B, 1))])
    assert r.true_positives == 1


def test_boxes_in_another_frame_do_not_match():
    r = agreement([frame(), frame((0, A, 0.9))], [frame((0, A, 1)), frame()])
    assert (r.true_positives, r.precision, r.recall, r.map50) == (0, 0.0, 0.0, 0.0)


def test_conf_counts_for_precision_and_recall_only():
    truth = [frame((0, A, 1), (0, B, 1))]
    pred = [frame((0, A, 0.9), (0, B, 0.05))]
    r = agreement(pred, truth, conf=0.25)
    assert (r.predictions, r.true_positives, r.recall) == (1, 1, 0.5)
    assert r.map50 == 1.0  # the low-scored box still completes the curve


def test_nothing_on_either_side_is_agreement():
    r = agreement([frame()], [frame()])
    assert (r.precision, r.recall, r.map50) == (1.0, 1.0, 1.0)
    r = agreement([frame((0, A, 0.9))], [frame()])
    assert (r.precision, r.map50) == (0.0, 0.0)


def test_all_point_ap_is_not_the_101_point_ap():
    # recall 0.5 reached at precision 1, nothing after: all-point AP 0.5 exactly; COCO's 101 points
    # would give 51/101
    assert all_point_ap(np.array([0.5]), np.array([1.0])) == pytest.approx(0.5)


def test_frames_are_spread_and_held_out_frames_are_not_calibration_frames():
    assert spread(84, 4) == [0, 21, 42, 63]
    assert spread(3, 10) == [0, 1, 2]
    parts = split(84, 4, 5)
    assert not set(parts.calibration) & set(parts.held_out)
    assert len(parts.held_out) == 5


def test_tensorrt_scale_is_the_hex_of_the_float32_scale():
    assert trt_scale_hex(-1.27, 0.5) == "3c23d70a"  # 0.01f
    assert struct.unpack(">f", bytes.fromhex(trt_scale_hex(0.0, 254.0)))[0] == pytest.approx(2.0)
    text = tensorrt_table({"b": (0.0, 1.0), "a": (-2.0, 1.0)}, header="TRT-8601-EntropyCalibration2")
    assert text.splitlines() == ["TRT-8601-EntropyCalibration2", f"a: {trt_scale_hex(-2, 1)}",
                                 f"b: {trt_scale_hex(0, 1)}"]


# -- one real quantization -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def quantized(models, media, tmp_path_factory):
    out = tmp_path_factory.mktemp("quantize")
    args = [str(models / MODEL), "-o", str(out / "int8.onnx"), "--calibrate", str(media / VIDEO),
            "--frames", str(CALIB_FRAMES), "--eval-frames", "4", "--timing-runs", "3",
            "--tensorrt-table", str(out / "int8.calib"), "--amct", str(out / "amct"), "--json"]
    return out, args


@pytest.fixture(scope="module")
def report(quantized):
    out, args = quantized
    import io
    from contextlib import redirect_stdout

    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["quantize", *args])
    assert rc == 0
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1, "--json prints one line: nothing of the quantizer's progress"
    return json.loads(lines[0])


def test_json_report_has_the_figures(report, quantized):
    out, _ = quantized
    for key in ("precision", "recall", "map50", "speedup", "float_fps", "int8_fps", "calibration_frames",
                "eval_frames", "output", "float_boxes", "int8_boxes", "ap_per_class"):
        assert key in report, key
    assert report["output"] == str(out / "int8.onnx")
    assert report["calibration_frames"] == CALIB_FRAMES
    assert report["eval_frames"] == 4
    assert report["eval_kind"] == "held-out frames of the calibration source"
    for key in ("precision", "recall", "map50"):
        assert 0.0 <= report[key] <= 1.0
    assert report["float_fps"] > 0 and report["int8_fps"] > 0
    assert report["speedup"] == pytest.approx(report["int8_fps"] / report["float_fps"])
    # the corridor's people are found by both: a broken INT8 model (or matcher) would not agree
    assert report["float_boxes"] > 0
    assert report["recall"] > 0.5


def test_output_is_a_qdq_model_that_onnxruntime_runs(report):
    import onnx
    import onnxruntime as ort

    model = onnx.load(report["output"])
    onnx.checker.check_model(model)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    # the head's tail stays float: the output is the float Transpose, not a dequantized INT8 tensor
    (producer,) = [n for n in model.graph.node if model.graph.output[0].name in n.output]
    assert producer.op_type == "Transpose"
    session = ort.InferenceSession(report["output"], providers=["CPUExecutionProvider"])
    (result,) = session.run(None, {"images": np.zeros((1, 3, 416, 416), np.float32)})
    assert result.shape == (1, 3549, 85)


def test_tensorrt_table_has_one_line_per_calibrated_tensor(report, models):
    import onnx

    lines = Path(report["tensorrt_table"]).read_text().splitlines()
    assert re.fullmatch(r"TRT-\d+-EntropyCalibration2", lines[0])
    assert len(lines) - 1 == report["tensorrt_tensors"] > 100
    graph = onnx.load(str(models / MODEL)).graph
    tensors = {t for n in graph.node for t in n.output} | {i.name for i in graph.input}
    scales = {}
    for line in lines[1:]:
        m = re.fullmatch(r"(.+): ([0-9a-f]{8})", line)
        assert m, line
        assert m.group(1) in tensors
        scales[m.group(1)] = struct.unpack(">f", bytes.fromhex(m.group(2)))[0]
    assert len(scales) == len(lines) - 1
    # YOLOX takes 0..255 pixels: the input's scale is its largest value / 127
    assert 200 / 127 < scales["images"] <= 255 / 127 + 1e-6


def test_amct_input_is_the_letterboxed_calibration_frames(report, media, models):
    import cv2

    from yoloedge.config import ModelConfig
    from yoloedge.pipeline.detector import open_detector

    files = sorted(Path(report["amct_dir"]).glob("*.bin"))
    assert len(files) == CALIB_FRAMES
    first = np.fromfile(files[0], np.float32)
    assert first.size == 3 * 416 * 416
    cap = cv2.VideoCapture(str(media / VIDEO))
    ok, image = cap.read()  # the first calibration frame is frame 0
    cap.release()
    assert ok
    det = open_detector(ModelConfig(path=str(models / MODEL)), warm_up=False)
    try:
        slot = np.empty((3, 416, 416), np.float32)
        det.letterbox(image, slot)
    finally:
        det.close()
    np.testing.assert_array_equal(first.reshape(3, 416, 416), slot)
    command = report["amct_command"]
    assert command.startswith("amct_onnx calibration ")
    assert "--input_shape=images:1,3,416,416" in command
    assert f"--data_dir={report['amct_dir']}" in command
    assert f"--batch_num={CALIB_FRAMES}" in command


def test_text_report_names_the_figures(report):
    text = format_report(report)
    assert "held-out frames of the calibration source" in text
    assert "mAP@0.5" in text and "speedup" in text and "VOC all-point" in text
    assert "trtexec --int8 --calib=" in text and "amct_onnx calibration" in text


def test_a_folder_calibrates_and_eval_names_another_source(tmp_path, models, media, capsys):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("bus.jpg", "zidane.jpg"):
        (folder / name).write_bytes((media / name).read_bytes())
    assert main(["quantize", str(models / MODEL), "-o", str(tmp_path / "int8.onnx"), "--calibrate", str(folder),
                 "--eval", str(media / VIDEO), "--eval-frames", "2", "--timing-runs", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["calibration_frames"] == 2  # --frames 32 asked, the folder has two
    assert (report["eval_source"], report["eval_frames"]) == (str(media / VIDEO), 2)
    assert report["eval_kind"] == "a separate source"


# -- errors ----------------------------------------------------------------------------------------

def _fails(args, capsys) -> str:
    rc = main(["quantize", *args])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert "Traceback" not in err
    return err


def test_not_an_onnx_file_exits_1(tmp_path, media, capsys):
    bad = tmp_path / "model.onnx"
    bad.write_text("not a model\n")
    err = _fails([str(bad), "-o", str(tmp_path / "o.onnx"), "--calibrate", str(media / VIDEO)], capsys)
    assert "model.onnx" in err and "yoloedge quantize:" in err


def test_an_already_quantized_model_exits_1(tmp_path, models, media, capsys):
    err = _fails([str(models / "yolov8n_coco_int8_qdq.onnx"), "-o", str(tmp_path / "o.onnx"), "--calibrate",
                  str(media / VIDEO), "--frames", "1"], capsys)
    assert "already quantized" in err
    assert not (tmp_path / "o.onnx").exists()


def test_missing_model_exits_1(tmp_path, media, capsys):
    err = _fails([str(tmp_path / "none.onnx"), "-o", str(tmp_path / "o.onnx"), "--calibrate",
                  str(media / VIDEO)], capsys)
    assert "no such model file" in err


def test_empty_folder_exits_1(tmp_path, models, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    err = _fails([str(models / MODEL), "-o", str(tmp_path / "o.onnx"), "--calibrate", str(empty)], capsys)
    assert "no frames to calibrate on" in err


def test_no_frame_left_for_the_report_exits_1(tmp_path, models, media, capsys):
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "bus.jpg").write_bytes((media / "bus.jpg").read_bytes())
    err = _fails([str(models / MODEL), "-o", str(tmp_path / "o.onnx"), "--calibrate", str(folder)], capsys)
    assert "--eval" in err


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["quantize", "m.onnx", "-o", str(tmp_path / "o"), "--calibrate", "x", "--frames", "0"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["quantize", "m.onnx", "--calibrate", "x"])  # no -o
    assert exc.value.code == 2


BLOCK_ONNX = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "onnx" or name.startswith("onnx."):
            raise ModuleNotFoundError(name)
        return None
sys.meta_path.insert(0, Block())
from yoloedge.cli.main import main
from yoloedge.cli.quantize import format_report
sys.exit(main(sys.argv[1:]))
"""


def test_missing_onnx_says_how_to_install_it(tmp_path, models, media):
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_ONNX, "quantize", str(models / MODEL), "-o", str(tmp_path / "o.onnx"),
         "--calibrate", str(media / VIDEO)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    assert proc.returncode == 1, proc.stderr
    assert "pip install 'yoloedge[quantize]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "o.onnx").exists()

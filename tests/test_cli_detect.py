"""`yoloedge detect` as a user runs it: a real subprocess, real model, real images."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO
from parity import mismatches

pytestmark = pytest.mark.shared

V8 = "yolov8n_coco_int8.onnx"


def detect(*args, timeout=120):
    proc = subprocess.run([sys.executable, "-m", "yoloedge", "detect", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return proc


def json_lines(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def check_record(record, name, width, height):
    assert set(record) == {"image", "width", "height", "detections"}
    assert record["image"] == str(name)
    assert (record["width"], record["height"]) == (width, height)
    for d in record["detections"]:
        assert set(d) >= {"label", "class_id", "score", "box"}
        assert isinstance(d["label"], str) and isinstance(d["class_id"], int)
        assert 0.25 <= d["score"] <= 1.0
        assert len(d["box"]) == 4 and all(isinstance(v, float) for v in d["box"])
        x1, y1, x2, y2 = d["box"]
        assert 0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height, d


@pytest.fixture(scope="module")
def model(models):
    return models / V8


@pytest.fixture(scope="module")
def bus(media):
    return media / "bus.jpg"


@pytest.fixture(scope="module")
def zidane(media):
    return media / "zidane.jpg"


@pytest.fixture(scope="module")
def two_images(model, bus, zidane):
    """One run on [bus, zidane] shared by the tests that only read its output."""
    return detect("--json", "-m", model, bus, zidane)


def test_json_bus_matches_the_ultralytics_reference(model, bus, references):
    proc = detect("--json", "-m", model, bus)
    assert proc.returncode == 0, proc.stderr
    records = json_lines(proc.stdout)
    assert len(records) == 1
    check_record(records[0], bus, 810, 1080)
    ref = json.loads((references / "yolov8n_coco_int8__bus__conf25_iou45.json").read_text())
    problems = mismatches(records[0]["detections"], ref["detections"])
    assert not problems, "\n".join(problems)
    labels = {d["label"] for d in records[0]["detections"]}
    assert {"person", "bus"} <= labels


def test_two_images_give_two_lines_in_order(two_images, bus, zidane):
    assert two_images.returncode == 0, two_images.stderr
    records = json_lines(two_images.stdout)
    assert [r["image"] for r in records] == [str(bus), str(zidane)]
    check_record(records[0], bus, 810, 1080)
    check_record(records[1], zidane, 1280, 720)
    assert "bus" in {d["label"] for d in records[0]["detections"]}
    assert "bus" not in {d["label"] for d in records[1]["detections"]}
    assert "tie" in {d["label"] for d in records[1]["detections"]}


def test_batched_run_prints_the_same_as_one_at_a_time(two_images, model, bus, zidane):
    """--batch on a fixed-batch-1 model must not change anything (the backend loops)."""
    proc = detect("--json", "--batch", "2", "-m", model, bus, zidane)
    assert proc.returncode == 0, proc.stderr
    assert json_lines(proc.stdout) == json_lines(two_images.stdout)


def test_a_folder_expands_to_its_images(tmp_path, model, bus, zidane, two_images):
    folder = tmp_path / "imgs"
    folder.mkdir()
    shutil.copy(bus, folder / "a_bus.jpg")
    shutil.copy(zidane, folder / "b_zidane.JPG")
    (folder / "notes.txt").write_text("not an image")
    proc = detect("--json", "-m", model, folder)
    assert proc.returncode == 0, proc.stderr
    records = json_lines(proc.stdout)
    assert [r["image"] for r in records] == [str(folder / "a_bus.jpg"), str(folder / "b_zidane.JPG")]
    direct = json_lines(two_images.stdout)
    assert [r["detections"] for r in records] == [r["detections"] for r in direct]


def test_table_output_lists_the_labels(model, bus):
    proc = detect("-m", model, bus)
    assert proc.returncode == 0, proc.stderr
    assert not proc.stdout.lstrip().startswith("{")
    assert str(bus) in proc.stdout
    assert "person" in proc.stdout and "bus" in proc.stdout


def test_missing_image_exits_2_and_the_others_are_still_printed(tmp_path, model, bus, zidane):
    missing = tmp_path / "missing.jpg"
    proc = detect("--json", "-m", model, bus, missing, zidane)
    assert proc.returncode == 2
    assert str(missing) in proc.stderr
    assert [r["image"] for r in json_lines(proc.stdout)] == [str(bus), str(zidane)]


def test_corrupt_image_exits_2(tmp_path, model, bus):
    bad = tmp_path / "x.jpg"
    bad.write_bytes(b"\x00\x01 definitely not a jpeg " * 50)
    proc = detect("--json", "-m", model, bad, bus)
    assert proc.returncode == 2
    assert str(bad) in proc.stderr
    assert [r["image"] for r in json_lines(proc.stdout)] == [str(bus)]


def test_missing_model_exits_2_with_a_message(tmp_path, bus):
    missing = tmp_path / "nope.onnx"
    proc = detect("--json", "-m", missing, bus)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert str(missing) in proc.stderr and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_model_exits_2_with_a_message(tmp_path, bus):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xde\xad\xbe\xef" * 1000)
    proc = detect("--json", "-m", bad, bus)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert str(bad) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_classes_filter_keeps_only_bus(model, bus):
    proc = detect("--json", "--classes", "bus", "-m", model, bus)
    assert proc.returncode == 0, proc.stderr
    dets = json_lines(proc.stdout)[0]["detections"]
    assert dets, "the bus itself is gone"
    assert {d["label"] for d in dets} == {"bus"}
    assert {d["class_id"] for d in dets} == {5}


def test_unknown_class_exits_2_and_suggests(model, bus):
    proc = detect("--json", "--classes", "buss", "-m", model, bus)
    assert proc.returncode == 2
    assert "buss" in proc.stderr and "'bus'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wrong_format_exits_2_naming_the_shapes(model, bus):
    proc = detect("--json", "--format", "yolox", "-m", model, bus)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "[1, 84, 8400]" in proc.stderr
    assert "yolox" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_model_that_is_a_fifo_is_named_as_such_without_blocking(tmp_path, bus):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    proc = subprocess.run([sys.executable, "-m", "yoloedge", "detect", "-m", str(fifo), str(bus)],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "not a regular file (a FIFO)" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("arg", ["rtsp://admin:D1zA D1zB@127.0.0.1/s", "admin:D1zA/D1zB@127.0.0.1/s",
                                 "http://127.0.0.1/video.cgi?usr=admin&psw=D1zA&D1zB",
                                 "//me:D1zA?D1zB@127.0.0.1/s"])
def test_a_url_given_for_an_input_is_named_without_its_secrets(tmp_path, model, bus, arg):
    """A camera URL pasted as an image, a model or a labels file: every message names it in its
    display form (the host stays, the credentials go); the good image is still processed."""
    proc = detect("--json", "-m", model, bus, arg)
    assert proc.returncode == 2
    assert "127.0.0.1" in proc.stderr and "***" in proc.stderr, proc.stderr
    assert [r["image"] for r in json_lines(proc.stdout)] == [str(bus)]
    for args in (("-m", arg, bus), ("--labels", arg, "-m", model, bus)):
        refused = detect("--json", *args)
        assert refused.returncode == 2 and "***" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr, refused.stderr
        proc.stderr += refused.stderr
    assert "D1z" not in proc.stdout + proc.stderr, proc.stderr

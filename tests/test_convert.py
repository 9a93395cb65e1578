"""`yoloedge convert atc|trt`: the commands derived from real and synthetic ONNX models, the AIPP
file against hand-computed values, npu-smi parsing, and the CLI as a subprocess (with the real
tools absent, and with stand-in `atc` / `trtexec` scripts that record how they were called)."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from conftest import REPO
from onnx_models import make_dynamic_batch_copy_of, make_dynamic_batch_v8_model, make_fixed_batch_v8_model
from yoloedge.convert import ConvertError, inspect_onnx
from yoloedge.convert.aipp import AippSettings, aipp_config, number
from yoloedge.convert.atc import (AtcOptions, build_atc, chip_names, detect_soc_version, normalise_soc,
                                  soc_version_from_npu_smi)
from yoloedge.convert.source import parse_batches, shell_line
from yoloedge.convert.trt import JETSON_TRTEXEC, TrtOptions, build_trtexec

V8 = "yolov8n_coco_int8.onnx"
V8_QDQ = "yolov8n_coco_int8_qdq.onnx"

# `npu-smi info` on an Atlas 300I Pro (two 310P3 chips), laid out as the npu-smi docs describe the
# table: a header with the tool and driver versions, per device one line "NPU Name | Health | Power
# Temp Hugepages" and one line "Chip Device | Bus-Id | AICore Memory-Usage", then the process table.
NPU_SMI_300I_PRO = """\
+--------------------------------------------------------------------------------------------------------+
| npu-smi 23.0.rc3                                 Version: 23.0.rc3                                     |
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Name                  | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)                        |
+===============================+=================+======================================================+
| 0       310P3                 | OK              | NA           47                0     / 0             |
| 0       0                     | 0000:01:00.0    | 0            1657 / 21534                            |
+===============================+=================+======================================================+
| 1       310P3                 | OK              | NA           45                0     / 0             |
| 0       1                     | 0000:02:00.0    | 0            1640 / 21534                            |
+===============================+=================+======================================================+
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Chip                  | Process id      | Process name             | Process memory(MB)        |
+===============================+=================+======================================================+
| No running processes found in NPU 0                                                                    |
+===============================+=================+======================================================+
| No running processes found in NPU 1                                                                    |
+===============================+=================+======================================================+
"""

# Atlas 200I A2 (one 310B4, the Health column says Warning): chip rows without a process table.
NPU_SMI_200I_A2 = """\
+--------------------------------------------------------------------------------------------------------+
| npu-smi 23.0.0                                   Version: 23.0.0                                       |
+-------------------------------+-----------------+------------------------------------------------------+
| NPU     Name                  | Health          | Power(W)     Temp(C)           Hugepages-Usage(page) |
| Chip    Device                | Bus-Id          | AICore(%)    Memory-Usage(MB)                        |
+===============================+=================+======================================================+
| 0       310B4                 | Warning         | 0.0          55                15    / 15            |
| 0       0                     | NA              | 0            1983 / 3729                             |
+===============================+=================+======================================================+
"""


# -- helpers -----------------------------------------------------------------------------------

def convert(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, "-m", "yoloedge", "convert", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)


def bare_env(tmp_path: Path, tools: dict[str, str] | None = None) -> dict:
    """An environment whose PATH holds the given stand-in tools (none by default) and the system's
    /usr/bin and /bin (for the scripts' own needs) only, so that a real atc / trtexec / npu-smi
    (installed under /usr/local) cannot change the outcome."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (tools or {}).items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if k != "PATH"}
    env["PATH"] = os.pathsep.join([str(bin_dir), "/usr/bin", "/bin"])
    return env


def aipp_fields(text: str) -> dict[str, str]:
    """key -> value of the aipp_op block (comments and braces dropped)."""
    fields = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def script_command(path: Path) -> list[str]:
    """The command line of a generated script, split the way sh would."""
    lines = [l for l in path.read_text().splitlines() if l and not l.startswith("#") and l != "set -e"]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


@pytest.fixture
def dynamic_v8(tmp_path):
    return make_dynamic_batch_v8_model(tmp_path / "meter_dyn.onnx", size=64)


@pytest.fixture
def fixed_v8(tmp_path):
    return make_fixed_batch_v8_model(tmp_path / "meter_fixed.onnx", size=64)


def open_size_model(path: Path, imgsz_meta: str | None) -> Path:
    """The colour meter with height/width left open (and optionally Ultralytics imgsz metadata)."""
    model = onnx.load(str(make_dynamic_batch_v8_model(path, size=64)))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].Clear()
    dims[2].dim_param = "height"
    dims[3].Clear()
    dims[3].dim_param = "width"
    if imgsz_meta is not None:
        helper.set_model_props(model, {"imgsz": imgsz_meta, "task": "detect"})
    onnx.save(model, str(path))
    return path


# -- reading the ONNX --------------------------------------------------------------------------

def test_inspect_synthetic_models(dynamic_v8, fixed_v8):
    dyn = inspect_onnx(str(dynamic_v8))
    assert (dyn.input_name, dyn.shape, dyn.dtype) == ("images", (-1, 3, 64, 64), np.float32)
    assert dyn.batch_is_dynamic and dyn.nchw
    fixed = inspect_onnx(str(fixed_v8))
    assert fixed.shape == (1, 3, 64, 64) and not fixed.batch_is_dynamic


def test_inspect_shared_model_reads_ultralytics_metadata(models):
    model = inspect_onnx(str(models / V8))
    assert model.input_name == "images" and model.shape == (1, 3, 640, 640)
    assert model.metadata.imgsz == (640, 640)


def test_inspect_rejects_missing_and_non_onnx_files(tmp_path):
    with pytest.raises(ConvertError, match="not found"):
        inspect_onnx(str(tmp_path / "nope.onnx"))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"definitely not protobuf")
    with pytest.raises(ConvertError, match="cannot read"):
        inspect_onnx(str(junk))


def test_parse_batches():
    assert parse_batches("8,1,4,2,4") == (1, 2, 4, 8)
    assert parse_batches(None) is None
    for bad in ("0,1", "a,b", ",", "1.5"):
        with pytest.raises(ConvertError):
            parse_batches(bad)


# -- ATC commands ------------------------------------------------------------------------------

def test_atc_command_fixed_batch_synthetic(fixed_v8, tmp_path):
    plan = build_atc(inspect_onnx(str(fixed_v8)), AtcOptions(output=str(tmp_path / "out" / "meter"),
                                                             soc_version="Ascend310P3"))
    base = tmp_path / "out" / "meter"
    assert plan.argv == [
        "atc", f"--model={fixed_v8}", "--framework=5", f"--output={base}", "--soc_version=Ascend310P3",
        "--input_format=NCHW", "--input_shape=images:1,3,64,64", f"--insert_op_conf={base}.aipp.cfg",
        "--output_type=FP32", "--log=info"]
    assert plan.gears == () and plan.batch == 1
    assert plan.om_path == f"{base}.om" and plan.script_path == f"{base}.atc.sh"
    assert shell_line(plan.argv) == (
        f'atc --model={fixed_v8} --framework=5 --output={base} --soc_version=Ascend310P3 --input_format=NCHW '
        f'--input_shape="images:1,3,64,64" --insert_op_conf={base}.aipp.cfg --output_type=FP32 --log=info')


def test_atc_command_dynamic_gears_synthetic(dynamic_v8, tmp_path):
    plan = build_atc(inspect_onnx(str(dynamic_v8)),
                     AtcOptions(output=str(tmp_path / "m"), soc_version="Ascend310P3",
                                batches=(1, 2, 4, 8), aipp=False, output_type="FP16"))
    assert "--input_shape=images:-1,3,64,64" in plan.argv
    assert "--dynamic_batch_size=1,2,4,8" in plan.argv
    assert "--output_type=FP16" in plan.argv
    assert not any(a.startswith("--insert_op_conf") for a in plan.argv)
    assert plan.gears == (1, 2, 4, 8) and plan.batch == 8 and plan.aipp_path is None
    assert '--input_shape="images:-1,3,64,64" --dynamic_batch_size="1,2,4,8"' in shell_line(plan.argv)


def test_atc_one_batch_on_a_dynamic_model_is_fixed(dynamic_v8, tmp_path):
    model = inspect_onnx(str(dynamic_v8))
    for batches, dim in ((None, 1), ((4,), 4)):
        plan = build_atc(model, AtcOptions(output=str(tmp_path / "m"), soc_version="Ascend310P3", batches=batches))
        assert f"--input_shape=images:{dim},3,64,64" in plan.argv
        assert not any(a.startswith("--dynamic_batch_size") for a in plan.argv)


def test_atc_refuses_gears_on_a_fixed_batch_model(fixed_v8, tmp_path):
    with pytest.raises(ConvertError, match="fixed batch of 1.*re-export"):
        build_atc(inspect_onnx(str(fixed_v8)), AtcOptions(output=str(tmp_path / "m"), soc_version="Ascend310P3",
                                                          batches=(1, 2, 4)))


def test_atc_gear_limits(dynamic_v8, tmp_path):
    model = inspect_onnx(str(dynamic_v8))
    with pytest.raises(ConvertError, match="2 to 100"):
        build_atc(model, AtcOptions(output=str(tmp_path / "m"), soc_version="A", batches=tuple(range(1, 102))))
    with pytest.raises(ConvertError, match="2048"):
        build_atc(model, AtcOptions(output=str(tmp_path / "m"), soc_version="A", batches=(1, 4096)))


def test_atc_open_image_size_from_metadata_or_imgsz(tmp_path):
    with_meta = inspect_onnx(str(open_size_model(tmp_path / "meta.onnx", "[320, 480]")))
    plan = build_atc(with_meta, AtcOptions(output=str(tmp_path / "a"), soc_version="Ascend310P3"))
    assert "--input_shape=images:1,3,320,480" in plan.argv
    assert "src_image_size_w : 480" in plan.aipp_text and "src_image_size_h : 320" in plan.aipp_text
    plan = build_atc(with_meta, AtcOptions(output=str(tmp_path / "a"), soc_version="Ascend310P3", imgsz=(256, 256)))
    assert "--input_shape=images:1,3,256,256" in plan.argv
    bare = inspect_onnx(str(open_size_model(tmp_path / "bare.onnx", None)))
    with pytest.raises(ConvertError, match="--imgsz"):
        build_atc(bare, AtcOptions(output=str(tmp_path / "b"), soc_version="Ascend310P3"))


def test_atc_refuses_another_size_for_a_static_model(fixed_v8, tmp_path):
    with pytest.raises(ConvertError, match="fixed input size 64x64"):
        build_atc(inspect_onnx(str(fixed_v8)), AtcOptions(output=str(tmp_path / "m"), soc_version="Ascend310P3",
                                                          imgsz=(640, 640)))


def test_atc_refuses_a_channels_last_model(tmp_path):
    graph = helper.make_graph([helper.make_node("Identity", ["images"], ["output0"])], "nhwc",
                              [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 64, 64, 3])],
                              [helper.make_tensor_value_info("output0", TensorProto.FLOAT, [1, 64, 64, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path = tmp_path / "nhwc.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ConvertError, match="channels-last"):
        build_atc(inspect_onnx(str(path)), AtcOptions(output=str(tmp_path / "m"), soc_version="Ascend310P3"))


def test_atc_command_shared_fixed_batch_model(models, tmp_path):
    onnx_path = models / V8
    plan = build_atc(inspect_onnx(str(onnx_path)), AtcOptions(output=str(tmp_path / "yolov8n"),
                                                              soc_version="Ascend310P3"))
    out = tmp_path / "yolov8n"
    assert shell_line(plan.argv) == (
        f'atc --model={onnx_path} --framework=5 --output={out} --soc_version=Ascend310P3 --input_format=NCHW '
        f'--input_shape="images:1,3,640,640" --insert_op_conf={out}.aipp.cfg --output_type=FP32 --log=info')


def test_atc_command_shared_model_with_dynamic_gears(models, tmp_path):
    onnx_path = make_dynamic_batch_copy_of(models / V8_QDQ, tmp_path / "yolov8n_dyn.onnx")
    plan = build_atc(inspect_onnx(str(onnx_path)),
                     AtcOptions(output=str(tmp_path / "yolov8n_dyn"), soc_version="Ascend310P3",
                                batches=(1, 2, 4, 8)))
    out = tmp_path / "yolov8n_dyn"
    assert shell_line(plan.argv) == (
        f'atc --model={onnx_path} --framework=5 --output={out} --soc_version=Ascend310P3 --input_format=NCHW '
        f'--input_shape="images:-1,3,640,640" --dynamic_batch_size="1,2,4,8" '
        f'--insert_op_conf={out}.aipp.cfg --output_type=FP32 --log=info')
    assert plan.batch == 8


# -- AIPP --------------------------------------------------------------------------------------

YOLO_640_AIPP = """\
# AIPP configuration for ATC (--insert_op_conf), written by `yoloedge convert atc` for yolov8n_coco_int8.onnx.
# Input: 640x640 letterboxed uint8 frames, NHWC, RGB frames, model trained on RGB.
# Model normalisation: pixel / 255, mean (0, 0, 0), std (1, 1, 1).
# ATC applies, per channel i: out_i = (in_i - mean_chn_i - min_chn_i) * var_reci_chn_i
aipp_op {
    aipp_mode : static
    related_input_rank : 0
    input_format : RGB888_U8
    src_image_size_w : 640
    src_image_size_h : 640
    crop : false
    csc_switch : false
    rbuv_swap_switch : false
    mean_chn_0 : 0
    mean_chn_1 : 0
    mean_chn_2 : 0
    min_chn_0 : 0
    min_chn_1 : 0
    min_chn_2 : 0
    var_reci_chn_0 : 0.003921568627
    var_reci_chn_1 : 0.003921568627
    var_reci_chn_2 : 0.003921568627
}
"""


def test_aipp_for_yolo_exact_text():
    assert aipp_config(AippSettings(640, 640), "yolov8n_coco_int8.onnx") == YOLO_640_AIPP


def test_aipp_yolo_scale_is_one_over_255():
    fields = aipp_fields(aipp_config(AippSettings(640, 640)))
    for i in range(3):
        assert float(fields[f"var_reci_chn_{i}"]) == pytest.approx(0.00392157, abs=5e-9)
        assert float(fields[f"var_reci_chn_{i}"]) == pytest.approx(1 / 255, rel=1e-9)
        assert fields[f"mean_chn_{i}"] == "0" and fields[f"min_chn_{i}"] == "0"


def test_aipp_imagenet_normalisation_hand_checked():
    settings = AippSettings(224, 224, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    fields = aipp_fields(aipp_config(settings))
    # 0.485 * 255 = 123.675, 0.456 * 255 = 116.28, 0.406 * 255 = 103.53 (no binary noise in the file)
    assert [fields[f"min_chn_{i}"] for i in range(3)] == ["123.675", "116.28", "103.53"]
    assert [fields[f"mean_chn_{i}"] for i in range(3)] == ["0", "0", "0"]
    # 1 / (0.229 * 255) = 0.0171247538..., 1 / (0.224 * 255) = 0.0175070028..., 1 / (0.225 * 255) = 0.01742919389978...
    assert [fields[f"var_reci_chn_{i}"] for i in range(3)] == ["0.01712475383", "0.0175070028", "0.0174291939"]
    # The documented formula then gives the torchvision normalisation for a mid-grey pixel.
    out = [(128 - 0 - float(fields[f"min_chn_{i}"])) * float(fields[f"var_reci_chn_{i}"]) for i in range(3)]
    want = [(128 / 255 - m) / s for m, s in zip((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))]
    assert out == pytest.approx(want, rel=1e-8)


def test_aipp_colour_order_sets_the_swap():
    cases = {("rgb", "rgb"): "false", ("bgr", "rgb"): "true", ("rgb", "bgr"): "true", ("bgr", "bgr"): "false"}
    for (frame, model), swap in cases.items():
        text = aipp_config(AippSettings(640, 640, frame_color=frame, model_color=model))
        assert aipp_fields(text)["rbuv_swap_switch"] == swap, (frame, model)
        assert ("R and B swapped" in text) == (swap == "true")


def test_aipp_yolox_takes_raw_pixels():
    fields = aipp_fields(aipp_config(AippSettings(416, 416, frame_color="bgr", model_color="bgr", normalize=False)))
    assert [fields[f"var_reci_chn_{i}"] for i in range(3)] == ["1", "1", "1"]
    assert fields["rbuv_swap_switch"] == "false"
    assert (fields["src_image_size_w"], fields["src_image_size_h"]) == ("416", "416")


def test_aipp_fixed_fields():
    fields = aipp_fields(aipp_config(AippSettings(640, 384)))
    assert fields["aipp_mode"] == "static" and fields["input_format"] == "RGB888_U8"
    assert fields["csc_switch"] == "false"
    assert (fields["src_image_size_w"], fields["src_image_size_h"]) == ("640", "384")


def test_aipp_rejects_bad_settings():
    with pytest.raises(ConvertError):
        AippSettings(640, 640, std=(0.2, 0.0, 0.2))
    with pytest.raises(ConvertError):
        AippSettings(640, 640, frame_color="yuv")
    with pytest.raises(ConvertError):
        AippSettings(0, 640)


def test_number_format():
    assert number(0.485 * 255) == "123.675" and number(0.0) == "0" and number(1.0) == "1"


# -- npu-smi / soc_version ---------------------------------------------------------------------

def test_npu_smi_chip_names():
    assert chip_names(NPU_SMI_300I_PRO) == ["310P3", "310P3"]
    assert chip_names(NPU_SMI_200I_A2) == ["310B4"]


def test_soc_version_from_npu_smi():
    assert soc_version_from_npu_smi(NPU_SMI_300I_PRO) == "Ascend310P3"
    assert soc_version_from_npu_smi(NPU_SMI_200I_A2) == "Ascend310B4"
    mixed = NPU_SMI_300I_PRO.replace("| 1       310P3 ", "| 1       910B3 ")
    with pytest.raises(ConvertError, match="different chips"):
        soc_version_from_npu_smi(mixed)
    with pytest.raises(ConvertError, match="--soc-version"):
        soc_version_from_npu_smi("command not supported\n")


def test_soc_version_names():
    assert normalise_soc("Ascend310P3") == "Ascend310P3"
    assert normalise_soc("310P3") == "Ascend310P3"
    assert normalise_soc("auto", detect=lambda: "Ascend310B4") == "Ascend310B4"
    with pytest.raises(ConvertError):
        normalise_soc("Ascend 310")


def test_auto_soc_without_npu_smi_says_what_to_do(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConvertError, match="npu-smi.*--soc-version"):
        detect_soc_version()


# -- TensorRT ----------------------------------------------------------------------------------

def test_trtexec_dynamic_batch_profile(dynamic_v8, tmp_path):
    plan = build_trtexec(inspect_onnx(str(dynamic_v8)),
                         TrtOptions(output=str(tmp_path / "m.engine"), fp16=True, batches=(1, 4, 8), workspace_mb=2048))
    assert plan.argv == ["trtexec", f"--onnx={dynamic_v8}", f"--saveEngine={tmp_path / 'm.engine'}",
                         "--minShapes=images:1x3x64x64", "--optShapes=images:4x3x64x64",
                         "--maxShapes=images:8x3x64x64", "--fp16", "--verbose", "--memPoolSize=workspace:2048"]
    assert plan.script_path == str(tmp_path / "m.trtexec.sh") and plan.batch == 8


def test_trtexec_batch_forms(dynamic_v8, tmp_path):
    model = inspect_onnx(str(dynamic_v8))
    for batches, profile in ((None, (1, 1, 1)), ((4,), (4, 4, 4)), ((1, 8), (1, 8, 8))):
        assert build_trtexec(model, TrtOptions(output=str(tmp_path / "m.engine"), batches=batches)).profile == profile
    with pytest.raises(ConvertError, match="MIN,OPT,MAX"):
        build_trtexec(model, TrtOptions(output=str(tmp_path / "m.engine"), batches=(1, 2, 4, 8)))


def test_trtexec_static_model_takes_no_shapes(fixed_v8, tmp_path):
    plan = build_trtexec(inspect_onnx(str(fixed_v8)), TrtOptions(output=str(tmp_path / "m.engine"), int8=True))
    assert not any("Shapes" in a for a in plan.argv)
    assert "--int8" in plan.argv and plan.profile is None and plan.batch == 1
    assert any("QDQ" in n for n in plan.notes)


def test_trtexec_shared_models(models, tmp_path):
    fixed = build_trtexec(inspect_onnx(str(models / V8)), TrtOptions(output=str(tmp_path / "v8.engine")))
    assert fixed.argv == ["trtexec", f"--onnx={models / V8}", f"--saveEngine={tmp_path / 'v8.engine'}", "--verbose"]
    dyn_path = make_dynamic_batch_copy_of(models / V8_QDQ, tmp_path / "v8_dyn.onnx")
    dyn = build_trtexec(inspect_onnx(str(dyn_path)), TrtOptions(output=str(tmp_path / "v8_dyn.engine"),
                                                                 fp16=True, batches=(1, 4, 8)))
    assert shell_line(dyn.argv) == (
        f"trtexec --onnx={dyn_path} --saveEngine={tmp_path / 'v8_dyn.engine'} "
        f"--minShapes=images:1x3x640x640 --optShapes=images:4x3x640x640 --maxShapes=images:8x3x640x640 --fp16 "
        f"--verbose")


# -- the CLI -----------------------------------------------------------------------------------

def test_cli_atc_dry_run_writes_script_and_aipp(fixed_v8, tmp_path):
    out = tmp_path / "om" / "meter"
    proc = convert("atc", "--onnx", fixed_v8, "--output", out, "--soc-version", "Ascend310P3", "--dry-run",
                   env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    script = Path(f"{out}.atc.sh")
    assert script.is_file() and os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/bin/sh\n")
    argv = script_command(script)
    assert argv[0] == "atc" and "--input_shape=images:1,3,64,64" in argv
    assert f"--insert_op_conf={out}.aipp.cfg" in argv
    aipp = Path(f"{out}.aipp.cfg").read_text()
    assert aipp_fields(aipp)["src_image_size_w"] == "64"
    assert '--input_shape="images:1,3,64,64"' in proc.stdout
    assert "atc is not installed here" in proc.stdout and str(script) in proc.stdout
    assert "input: aipp" in proc.stdout  # the config lines that go with the .om
    assert not Path(f"{out}.om").exists()


def test_cli_atc_aipp_yuv420sp_writes_the_nv12_block(fixed_v8, tmp_path):
    """`--aipp yuv420sp`: the block that takes the NV12 pictures of `decoder: dvpp` cameras."""
    out = tmp_path / "meter"
    proc = convert("atc", "--onnx", fixed_v8, "--output", out, "--soc-version", "Ascend310P3", "--dry-run",
                   "--aipp", "yuv420sp", env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    fields = aipp_fields(Path(f"{out}.aipp.cfg").read_text())
    assert fields["input_format"] == "YUV420SP_U8" and fields["csc_switch"] == "true"
    assert fields["matrix_r0c0"] == "298" and fields["input_bias_1"] == "128"
    assert "DVPP" in proc.stdout and "color:" not in proc.stdout
    plain = convert("atc", "--onnx", fixed_v8, "--output", tmp_path / "plain", "--soc-version", "Ascend310P3",
                    "--dry-run", "--aipp", env=bare_env(tmp_path))
    assert plain.returncode == 0, plain.stderr
    assert aipp_fields(Path(f"{tmp_path / 'plain'}.aipp.cfg").read_text())["input_format"] == "RGB888_U8"


def test_cli_atc_without_atc_fails_clearly(fixed_v8, tmp_path):
    out = tmp_path / "meter"
    proc = convert("atc", "--onnx", fixed_v8, "--output", out, "--soc-version", "Ascend310P3",
                   env=bare_env(tmp_path))
    assert proc.returncode == 69
    assert "atc not found" in proc.stderr and f"{out}.atc.sh" in proc.stderr
    assert Path(f"{out}.atc.sh").is_file()  # written anyway, to be run where CANN is


def test_cli_atc_runs_the_tool_with_the_scripted_command(dynamic_v8, tmp_path):
    record = tmp_path / "atc_args.txt"
    fake_atc = f"""\
        for a in "$@"; do echo "$a"; done > {record}
        for a in "$@"; do case "$a" in --output=*) touch "${{a#--output=}}.om";; esac; done
        """
    out = tmp_path / "meter"
    proc = convert("atc", "--onnx", dynamic_v8, "--output", f"{out}.om", "--soc-version", "310P3",
                   "--batch", "1,2,4,8", "--no-aipp", env=bare_env(tmp_path, {"atc": fake_atc}))
    assert proc.returncode == 0, proc.stderr
    assert "basename" in proc.stderr  # the .om given to --output was dropped, with a note
    called = record.read_text().splitlines()
    assert called == script_command(Path(f"{out}.atc.sh"))[1:]
    assert "--soc_version=Ascend310P3" in called and "--dynamic_batch_size=1,2,4,8" in called
    assert Path(f"{out}.om").is_file() and not Path(f"{out}.aipp.cfg").exists()


def test_cli_atc_passes_on_the_tool_failure(fixed_v8, tmp_path):
    proc = convert("atc", "--onnx", fixed_v8, "--output", tmp_path / "m", "--soc-version", "Ascend310P3",
                   env=bare_env(tmp_path, {"atc": "echo 'ATC run failed' >&2; exit 3\n"}))
    assert proc.returncode == 3
    assert "atc failed with exit code 3" in proc.stderr


def test_cli_atc_soc_auto_reads_npu_smi(fixed_v8, tmp_path):
    sample = tmp_path / "npu_smi.txt"
    sample.write_text(NPU_SMI_300I_PRO)
    env = bare_env(tmp_path, {"npu-smi": f'[ "$1" = info ] && cat {sample}\n'})
    proc = convert("atc", "--onnx", fixed_v8, "--output", tmp_path / "m", "--soc-version", "auto", "--dry-run",
                   env=env)
    assert proc.returncode == 0, proc.stderr
    assert "--soc_version=Ascend310P3" in script_command(tmp_path / "m.atc.sh")


def test_cli_atc_soc_auto_without_npu_smi(fixed_v8, tmp_path):
    proc = convert("atc", "--onnx", fixed_v8, "--output", tmp_path / "m", "--dry-run", env=bare_env(tmp_path))
    assert proc.returncode == 2
    assert "npu-smi" in proc.stderr and "--soc-version" in proc.stderr
    assert not (tmp_path / "m.atc.sh").exists()


def test_cli_input_errors_exit_2(fixed_v8, tmp_path):
    proc = convert("atc", "--onnx", tmp_path / "missing.onnx", "--output", tmp_path / "m",
                   "--soc-version", "Ascend310P3", "--dry-run", env=bare_env(tmp_path))
    assert proc.returncode == 2 and "not found" in proc.stderr
    proc = convert("atc", "--onnx", fixed_v8, "--output", tmp_path / "m", "--soc-version", "Ascend310P3",
                   "--batch", "1,4", "--dry-run", env=bare_env(tmp_path))
    assert proc.returncode == 2 and "fixed batch" in proc.stderr


def test_cli_atc_dry_run_on_shared_model(models, tmp_path):
    proc = convert("atc", "--onnx", models / V8, "--output", tmp_path / "yolov8n", "--soc-version", "Ascend310P3",
                   "--dry-run", env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "yolov8n.aipp.cfg").read_text() == YOLO_640_AIPP
    assert "imgsz 640x640 (metadata)" in proc.stdout


def test_cli_trt_dry_run_and_missing_trtexec(dynamic_v8, tmp_path):
    engine = tmp_path / "meter.engine"
    proc = convert("trt", "--onnx", dynamic_v8, "--output", engine, "--fp16", "--batch", "1,4,8",
                   "--workspace-mb", "512", "--dry-run", env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    argv = script_command(tmp_path / "meter.trtexec.sh")
    assert argv == ["trtexec", f"--onnx={dynamic_v8}", f"--saveEngine={engine}", "--minShapes=images:1x3x64x64",
                    "--optShapes=images:4x3x64x64", "--maxShapes=images:8x3x64x64", "--fp16",
                    "--verbose", "--memPoolSize=workspace:512"]
    if Path(JETSON_TRTEXEC).exists():
        pytest.skip("a JetPack trtexec is installed here")
    proc = convert("trt", "--onnx", dynamic_v8, "--output", engine, env=bare_env(tmp_path))
    assert proc.returncode == 69 and "trtexec not found" in proc.stderr


def test_cli_trt_batch_keeps_a_repeated_minimum_as_the_optimum(dynamic_v8, tmp_path):
    """--batch 1,1,8: optimised for single frames, up to 8; not the set {1, 8}, optimised for 8."""
    proc = convert("trt", "--onnx", dynamic_v8, "--output", tmp_path / "m.engine", "--batch", "1,1,8",
                   "--dry-run", env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    shapes = [a for a in script_command(tmp_path / "m.trtexec.sh") if "Shapes=" in a]
    assert shapes == ["--minShapes=images:1x3x64x64", "--optShapes=images:1x3x64x64", "--maxShapes=images:8x3x64x64"]


def test_cli_trt_script_calls_jetpacks_trtexec_by_its_path(dynamic_v8, tmp_path, monkeypatch):
    """On a Jetson trtexec is only in JetPack's folder, not on PATH: the saved script must name it
    there, or it fails when run as written. Elsewhere the script keeps the plain name."""
    import argparse
    import io

    from yoloedge.cli.convert import run_trt
    from yoloedge.convert import trt

    bare_env(tmp_path, {"jetpack-trtexec": 'echo "&&&& RUNNING TensorRT.trtexec [TensorRT v8601]"\n'})
    jetpack = tmp_path / "bin" / "jetpack-trtexec"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(trt, "JETSON_TRTEXEC", str(jetpack))
    args = argparse.Namespace(onnx=str(dynamic_v8), output=str(tmp_path / "m.engine"), fp16=False, int8=False,
                              batch="1,2,4", imgsz=None, workspace_mb=128, trt_version=None, dry_run=True,
                              simplify=False)
    out, err = io.StringIO(), io.StringIO()
    assert run_trt(args, out, err) == 0, err.getvalue()
    argv = script_command(tmp_path / "m.trtexec.sh")
    assert argv[0] == str(jetpack) and argv[-1] == "--workspace=128"  # and its banner chose 8.6's flag
    monkeypatch.setattr(trt, "JETSON_TRTEXEC", str(tmp_path / "no-jetpack" / "trtexec"))
    assert run_trt(args, io.StringIO(), io.StringIO()) == 0
    assert script_command(tmp_path / "m.trtexec.sh")[0] == "trtexec"


def test_cli_trt_runs_the_tool(fixed_v8, tmp_path):
    fake = """\
        for a in "$@"; do case "$a" in --saveEngine=*) echo engine > "${a#--saveEngine=}";; esac; done
        """
    engine = tmp_path / "meter.engine"
    proc = convert("trt", "--onnx", fixed_v8, "--output", engine, env=bare_env(tmp_path, {"trtexec": fake}))
    assert proc.returncode == 0, proc.stderr
    assert engine.read_text() == "engine\n"
    assert "backend: tensorrt" in proc.stdout


# -- trtexec flags per TensorRT version, and the config the command prints --------------------------

def test_trtexec_workspace_flag_follows_the_tensorrt_version(dynamic_v8, tmp_path):
    model = inspect_onnx(str(dynamic_v8))
    older = build_trtexec(model, TrtOptions(output=str(tmp_path / "m.engine"), batches=(1, 2, 4), workspace_mb=512,
                                            trt_version="8.6"))
    newer = build_trtexec(model, TrtOptions(output=str(tmp_path / "m.engine"), batches=(1, 2, 4), workspace_mb=512,
                                            trt_version="10"))
    assert older.argv[-1] == "--workspace=512" and not any("memPoolSize" in a for a in older.argv)
    assert newer.argv[-1] == "--memPoolSize=workspace:512" and not any("--workspace=" in a for a in newer.argv)
    assert older.argv[:-1] == newer.argv[:-1]  # the shapes are spelled alike in both
    assert "--minShapes=images:1x3x64x64" in older.argv and "--maxShapes=images:4x3x64x64" in older.argv
    with pytest.raises(ConvertError, match="--trt-version must be one of 8.6, 10"):
        build_trtexec(model, TrtOptions(output=str(tmp_path / "m.engine"), trt_version="9"))


def test_trtexec_banner_gives_the_version():
    from yoloedge.convert.trt import banner_version, version_family

    assert banner_version("&&&& RUNNING TensorRT.trtexec [TensorRT v100300] [b17] # trtexec --help") == "10.3"
    assert banner_version("&&&& RUNNING TensorRT.trtexec [TensorRT v8601] # trtexec --help") == "8.6"
    assert banner_version("&&&& RUNNING TensorRT.trtexec [TensorRT v101600]") == "10.16"
    assert banner_version("trtexec: command not found") is None
    assert [version_family(v) for v in ("8.6", "8.5.2.2", "10.3", "10.16.0.72", "11.0")] == ["8.6", "8.6", "10", "10",
                                                                                             "10"]


@pytest.mark.parametrize("banner, flag", [("v8601", "--workspace=256"), ("v100300", "--memPoolSize=workspace:256")])
def test_cli_trt_takes_the_flags_of_the_trtexec_here(dynamic_v8, tmp_path, banner, flag):
    fake = f"""\
        echo "&&&& RUNNING TensorRT.trtexec [TensorRT {banner}] # trtexec $*"
        """
    proc = convert("trt", "--onnx", dynamic_v8, "--output", tmp_path / "m.engine", "--batch", "1,2,4",
                   "--workspace-mb", "256", "--dry-run", env=bare_env(tmp_path, {"trtexec": fake}))
    assert proc.returncode == 0, proc.stderr
    assert script_command(tmp_path / "m.trtexec.sh")[-1] == flag
    version = "8.6" if banner == "v8601" else "10.3"
    assert f"is TensorRT {version})" in proc.stdout


def test_cli_trt_version_option_without_trtexec(dynamic_v8, tmp_path):
    proc = convert("trt", "--onnx", dynamic_v8, "--output", tmp_path / "m.engine", "--workspace-mb", "64",
                   "--trt-version", "8.6", "--dry-run", env=bare_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert script_command(tmp_path / "m.trtexec.sh")[-1] == "--workspace=64"
    default = convert("trt", "--onnx", dynamic_v8, "--output", tmp_path / "m.engine", "--workspace-mb", "64",
                      "--dry-run", env=bare_env(tmp_path))
    assert script_command(tmp_path / "m.trtexec.sh")[-1] == "--memPoolSize=workspace:64"
    assert "no TensorRT here; give --trt-version 8.6" in default.stdout
    bad = convert("trt", "--onnx", dynamic_v8, "--output", tmp_path / "m.engine", "--trt-version", "9",
                  env=bare_env(tmp_path))
    assert bad.returncode == 2 and "--trt-version" in bad.stderr


def test_cli_trt_prints_a_config_that_loads(dynamic_v8, tmp_path):
    from yoloedge.config.loader import load_config

    fake = """\
        for a in "$@"; do case "$a" in --saveEngine=*) echo engine > "${a#--saveEngine=}";; esac; done
        """
    engine = tmp_path / "meter.engine"
    proc = convert("trt", "--onnx", dynamic_v8, "--output", engine, "--batch", "1,4,8",
                   env=bare_env(tmp_path, {"trtexec": fake}))
    assert proc.returncode == 0, proc.stderr
    hint = proc.stdout.split("yoloedge.yaml for this engine:\n")[1].split("then check it")[0]
    path = tmp_path / "yoloedge.yaml"
    path.write_text("device_id: edge\n" + textwrap.dedent(hint))
    config = load_config(str(path), {})
    (acc,) = config.accelerators
    assert config.model.path == str(engine)
    assert (acc.backend, acc.devices, acc.batch) == ("tensorrt", (0,), 8)
    assert acc.options == {"source_onnx": str(dynamic_v8)}

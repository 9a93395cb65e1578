# ruff: noqa: E501  (the log fixtures below are whole log lines, kept as the tools print them)
"""`yoloedge convert`'s checks: the opset warning, the checked onnxslim simplification, `convert fp16`
against the float model on real images, and the slow-path summary read from ATC's and trtexec's logs
(recorded log text; the tools are stand-in scripts, as in test_convert.py).

The CLI runs in-process (`args.func(args, out, err)`) to keep these tests within a few seconds; the
float model is the smallest real one, YOLOX-nano at 416."""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest

from yoloedge.cli import convert as cli_convert
from yoloedge.cli.main import build_parser
from yoloedge.convert import opsets, rewrite, toollogs
from yoloedge.verify import read_inputs

YOLOX = "yolox_nano_coco_416.onnx"  # float32, opset 11, no metadata: --format yolox

# ATC's info log placing operators on the AI CPU engine. The line prefix follows CANN's log layout
# ("[LEVEL] MODULE(pid,process):timestamp [file:line]tid func: message"); `DNN_VM_AICPU` is the AI CPU
# engine's name in CANN's ATC option reference (stream_max_parallel_num). The message wording is
# UNCONFIRMED: no public ATC log naming per-operator engines was found.
ATC_LOG = """\
ATC start working now, please wait for a moment.
[INFO] GE(4123,atc.bin):2026-12-02-05:00:01.100.200 [engine_place.cc:120]4123 Run: op[/model.22/NonMaxSuppression] type[NonMaxSuppression] assigned to engine DNN_VM_AICPU
[INFO] GE(4123,atc.bin):2026-12-02-05:00:01.100.210 [engine_place.cc:120]4123 Run: op[/model.22/TopK] type[TopK] assigned to engine DNN_VM_AICPU
[INFO] GE(4123,atc.bin):2026-12-02-05:00:01.100.220 [engine_place.cc:120]4123 Run: op[/model.0/conv/Conv] type[Conv2D] assigned to engine AIcoreEngine
[WARNING] TBE(4123,atc.bin):2026-12-02-05:00:01.200.000 op[/model.22/NonZero] type[NonZero] is not supported by AI Core, fallback to AI CPU
[INFO] GE(4123,atc.bin):2026-12-02-05:00:01.100.230 [engine_place.cc:120]4123 Run: op[/model.22/NonMaxSuppression_1] type[NonMaxSuppression] assigned to engine DNN_VM_AICPU
ATC run success, welcome to the next use.
"""

# trtexec --verbose "Engine Layer Information": the first three lines in the TensorRT 8.2 form quoted
# in NVIDIA/TensorRT#2011 (`NAME, Tactic: N, IN[Half(...)] -> OUT[Half(...)]`); the rest in the 8.6/10.x
# form `IN (Half[...]) -> OUT (Float[...])` (UNCONFIRMED beyond the public thread excerpts), one layer
# left in FP32, one Myelin subgraph and one plugin.
TRTEXEC_LOG = """\
&&&& RUNNING TensorRT.trtexec [TensorRT v8601] # trtexec --onnx=m.onnx --fp16 --verbose
[12/02/2026-05:00:00] [V] [TRT] Engine Layer Information:
Layer(Reformat): Reformatting CopyNode for Input Tensor 0 to (Unnamed Layer* 0) [Convolution], Tactic: 1002, net_in[Float(1,3,640,640)] -> Reformatted Input Tensor 0[Half(1,3,640,640)]
Layer(CaskConvolution): (Unnamed Layer* 0) [Convolution] + (Unnamed Layer* 2) [Activation], Tactic: 1832046141070096030, Reformatted Input Tensor 0[Half(1,3,640,640)] -> (Unnamed Layer* 2) [Activation]_output[Half(1,16,320,320)]
Layer(CaskConvolution): (Unnamed Layer* 3) [Convolution], Tactic: 8839784824303350101, (Unnamed Layer* 2) [Activation]_output[Half(1,16,320,320)] -> (Unnamed Layer* 3) [Convolution]_output[Half(1,32,160,160)]
[12/02/2026-05:00:00] [V] [TRT] Layer(CaskConvolution): /model.22/cv3/Conv, Tactic: 0x0000000000000003, /model.21/Concat_output_0 (Half[1,64,80,80]) -> /model.22/cv3/Conv_output_0 (Float[1,80,80,80])
[12/02/2026-05:00:00] [V] [TRT] Layer(Myelin): {ForeignNode[/model.22/Reshape.../model.22/Concat_5]}, Tactic: 0x0000000000000000, /model.22/Concat_output_0 (Half[1,144,8400]) -> output0 (Float[1,84,8400])
[12/02/2026-05:00:00] [V] [TRT] Layer(PluginV2): /model.23/EfficientNMS, Tactic: 0x0000000000000000, output0 (Float[1,84,8400]) -> num_dets (Int32[1,1])
[12/02/2026-05:00:00] [V] [TRT] Layer(Reformat): Reformatting CopyNode for Output Tensor 0, Tactic: 0x0, x (Half[1,3]) -> y (Float[1,3])
"""


def run_cli(*argv: str) -> tuple[int, str, str]:
    args = build_parser().parse_args(["convert", *map(str, argv)])
    out, err = io.StringIO(), io.StringIO()
    return args.func(args, out, err), out.getvalue(), err.getvalue()


@pytest.fixture
def yolox(models) -> Path:
    return models / YOLOX


@pytest.fixture
def bus(media) -> Path:
    return media / "bus.jpg"


def with_opset(src: Path, dst: Path, version: int) -> Path:
    model = onnx.load(str(src))
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    onnx.save(model, str(dst))
    return dst


def fake_tool(tmp_path: Path, name: str, body: str) -> None:
    folder = tmp_path / "bin"
    folder.mkdir(exist_ok=True)
    tool = folder / name
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)


# -- opsets ------------------------------------------------------------------------------------

def test_opset_read_from_the_file_and_the_warning_fires_only_out_of_range(yolox, tmp_path):
    assert opsets.model_opset(str(yolox)) == 11
    assert opsets.opset_warning(11, opsets.ATC) is None and opsets.opset_warning(11, opsets.TRT["10"]) is None
    high = with_opset(yolox, tmp_path / "opset21.onnx", 21)
    assert opsets.model_opset(str(high)) == 21
    line = opsets.opset_warning(21, opsets.TRT["8.6"])
    assert line is not None and "opset 21" in line and "9..17" in line and "opset=17" in line
    assert opsets.model_opset(str(tmp_path / "missing.onnx")) is None


def test_cli_warns_on_an_out_of_range_opset_and_not_in_range(yolox, tmp_path):
    high = with_opset(yolox, tmp_path / "opset19.onnx", 19)
    status, _, err = run_cli("atc", "--onnx", high, "--output", tmp_path / "hi", "--soc-version", "310P3",
                             "--no-aipp", "--dry-run")
    assert status == 0
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "opset 19" in warnings[0] and "9..18" in warnings[0] and "opset=18" in warnings[0]
    status, _, err = run_cli("trt", "--onnx", yolox, "--output", tmp_path / "ok.engine", "--trt-version", "8.6",
                             "--dry-run")
    assert status == 0 and "warning:" not in err


# -- fp16 --------------------------------------------------------------------------------------

def test_fp16_is_a_valid_model_with_the_float_models_boxes(yolox, bus, media, tmp_path):
    half = tmp_path / "x16.onnx"
    status, out, err = run_cli("fp16", yolox, "-o", half, "--images", bus, media / "zidane.jpg", "--format", "yolox")
    assert status == 0, err
    model = onnx.load(str(half))
    onnx.checker.check_model(model)
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in model.graph.initializer)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # keep_io_types
    assert os.path.getsize(half) < 0.6 * os.path.getsize(yolox)
    agreement = rewrite.compare(str(yolox), str(half), read_inputs([str(bus)], 1).frames, "yolox")
    assert agreement.agree and agreement.matched == agreement.reference_boxes >= 4
    assert 0 < agreement.max_abs_diff < 1.0
    assert f"{agreement.reference_boxes + 3}/{agreement.reference_boxes + 3} boxes agree" in out  # bus 4 + zidane 3


def test_fp16_disagreement_fails_with_exit_1(yolox, bus, tmp_path):
    status, _, err = run_cli("fp16", yolox, "-o", tmp_path / "x16.onnx", "--images", bus, "--format", "yolox",
                             "--max-score-diff", "0", "--min-iou", "1")
    assert status == 1 and "disagree" in err and "do not use it" in err
    # a corrupted weight: the largest FP16 initializer zeroed
    model = onnx.load(str(tmp_path / "x16.onnx"))
    biggest = max(model.graph.initializer, key=lambda t: len(t.raw_data))
    arr = onnx.numpy_helper.to_array(biggest)
    biggest.CopyFrom(onnx.numpy_helper.from_array(np.zeros_like(arr), biggest.name))
    onnx.save(model, str(tmp_path / "broken.onnx"))
    broken = rewrite.compare(str(yolox), str(tmp_path / "broken.onnx"), read_inputs([str(bus)], 1).frames, "yolox")
    assert not broken.agree and broken.problems


def test_fp16_needs_images(yolox, tmp_path):
    status, _, err = run_cli("fp16", yolox, "-o", tmp_path / "x16.onnx")
    assert status == 2 and "--images" in err


# -- simplify ----------------------------------------------------------------------------------

def test_simplify_without_onnxslim_gives_the_install_hint(yolox, bus, tmp_path, monkeypatch):
    monkeypatch.setattr(cli_convert, "module_installed", lambda name: name != "onnxslim")
    status, _, err = run_cli("trt", "--onnx", yolox, "--output", tmp_path / "m.engine", "--trt-version", "10",
                             "--simplify", "--images", bus, "--dry-run")
    assert status == 69 and "pip install 'yoloedge[slim]'" in err
    assert not (tmp_path / "m.trtexec.sh").exists()


def test_simplified_graph_is_checked_and_converted(yolox, bus, tmp_path):
    pytest.importorskip("onnxslim", reason="onnxslim (the slim extra) is not installed")
    status, out, err = run_cli("trt", "--onnx", yolox, "--output", tmp_path / "m.engine", "--trt-version", "10",
                               "--simplify", "--images", bus, "--format", "yolox", "--dry-run")
    assert status == 0, err
    slim = tmp_path / "m.slim.onnx"
    assert slim.is_file() and "nodes" in out and "4/4 boxes agree" in out
    assert f"--onnx={slim}" in (tmp_path / "m.trtexec.sh").read_text()


# -- the converters' logs ----------------------------------------------------------------------

def test_atc_log_parser_finds_exactly_the_ai_cpu_operators():
    found = toollogs.parse_atc_log(ATC_LOG)
    assert found.aicpu == ("NonMaxSuppression", "TopK", "NonZero")
    assert found.summary() == ["3 operators run on the AI CPU (slow path, not the AI Core): "
                               "NonMaxSuppression, TopK, NonZero"]
    assert toollogs.parse_atc_log("ATC run success, welcome to the next use.\n").summary() == []


def test_trtexec_log_parser_finds_fp32_and_plugin_layers():
    found = toollogs.parse_trtexec_log(TRTEXEC_LOG, reduced_precision=True)
    assert found.fp32 == ("/model.22/cv3/Conv",)
    assert found.plugin == ("{ForeignNode[/model.22/Reshape.../model.22/Concat_5]}", "/model.23/EfficientNMS")
    fp32_build = toollogs.parse_trtexec_log(TRTEXEC_LOG, reduced_precision=False)
    assert fp32_build.fp32 == () and len(fp32_build.plugin) == 2


def test_cli_atc_saves_and_summarises_its_log(yolox, tmp_path, monkeypatch):
    (tmp_path / "atc.log.txt").write_text(ATC_LOG)
    fake_tool(tmp_path, "atc", f'[ "$ASCEND_SLOG_PRINT_TO_STDOUT" = 1 ] || exit 9\ncat {tmp_path / "atc.log.txt"}\n'
                               'for a in "$@"; do case "$a" in --output=*) touch "${a#--output=}.om";; esac; done\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    status, out, err = run_cli("atc", "--onnx", yolox, "--output", tmp_path / "x", "--soc-version", "310P3")
    assert status == 0, err
    assert (tmp_path / "x.atc.log").read_text() == ATC_LOG
    assert "slow paths: 3 operators run on the AI CPU (slow path, not the AI Core): NonMaxSuppression, TopK, " \
           "NonZero" in out


def test_cli_trtexec_saves_and_summarises_its_log(yolox, tmp_path, monkeypatch):
    (tmp_path / "trt.log.txt").write_text(TRTEXEC_LOG)
    fake_tool(tmp_path, "trtexec", f'cat {tmp_path / "trt.log.txt"}\n'
                                   'for a in "$@"; do case "$a" in --saveEngine=*) echo e > "${a#--saveEngine=}";; '
                                   'esac; done\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    status, out, err = run_cli("trt", "--onnx", yolox, "--output", tmp_path / "x.engine", "--fp16",
                               "--trt-version", "8.6")
    assert status == 0, err
    assert (tmp_path / "x.trtexec.log").is_file()
    assert "slow paths: 1 layer run in FP32 although reduced precision was asked: /model.22/cv3/Conv" in out
    assert "slow paths: 2 layers run by a plugin or Myelin" in out

"""`yoloedge convert atc|trt|fp16`: build the vendor converter's command from the ONNX, and run it.

The command is printed and written into a script next to the output (OUT.atc.sh, MODEL.trtexec.sh),
so it can be rerun or copied to the machine that has the toolkit. It is run at once when the tool is
installed and --dry-run is not given; its log is saved next to the output (OUT.atc.log,
MODEL.trtexec.log) and the operators it put on a slow path are summarised.

Before that: a warning when the model's opset is outside what the converter documents, and with
--simplify the onnxslim-simplified graph (checked against the original on --images) is converted
instead. `convert fp16` writes an FP16 ONNX, checked the same way.

Exit codes: 0 done (or, with --dry-run, written); 1 a rewritten model disagrees with the original;
2 the model or the options cannot work; 69 (EX_UNAVAILABLE) the converter (or onnxslim) is not
installed; otherwise the converter's own exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, TextIO

from ..convert import atc, opsets, rewrite, toollogs, trt
from ..convert.source import (ConvertError, SourceModel, find_tool, inspect_onnx, log_tail, output_dir_ready,
                              parse_batches, run_tool_logged, shell_line, write_script)
from ..postprocess import FORMATS
from ..runtime import module_installed
from ..verify import MAX_SCORE_DIFF, MIN_IOU

EXIT_DISAGREE = 1
EXIT_INPUT = 2
EXIT_UNAVAILABLE = 69  # sysexits.h EX_UNAVAILABLE


def add_parser(sub) -> None:
    p = sub.add_parser("convert", help="convert an ONNX model for Ascend (ATC) or TensorRT (trtexec)",
                       description="Print, save and run the ATC or trtexec command that converts an ONNX "
                                   "model, with every flag derived from the model.")
    tools = p.add_subparsers(dest="tool", metavar="TOOL")
    tools.required = True
    _add_atc(tools)
    _add_trt(tools)
    _add_fp16(tools)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--onnx", required=True, metavar="MODEL.onnx", help="the source ONNX model")
    p.add_argument("--imgsz", type=int, nargs=2, metavar=("H", "W"),
                   help="input size for models with open height/width (default: the model's imgsz metadata)")
    p.add_argument("--dry-run", action="store_true", help="print and write the command, do not run it")
    _add_checks(p)


def _add_checks(p: argparse.ArgumentParser) -> None:
    p.add_argument("--simplify", action="store_true",
                   help="simplify the graph with onnxslim first (pip install 'yoloedge[slim]'), checked "
                        "against the original on --images")
    p.add_argument("--images", nargs="+", metavar="PATH",
                   help="images, folders or videos to check a rewritten model on (ONNX Runtime, CPU)")
    p.add_argument("--format", choices=FORMATS, help="output layout for the check (default: recognised)")
    p.add_argument("--max-score-diff", type=float, default=MAX_SCORE_DIFF, metavar="D",
                   help=f"largest score difference that still agrees (default {MAX_SCORE_DIFF})")
    p.add_argument("--min-iou", type=float, default=MIN_IOU, metavar="IOU",
                   help=f"smallest box IoU that still agrees (default {MIN_IOU})")


def _add_atc(tools) -> None:
    p = tools.add_parser("atc", help="ONNX -> Ascend .om with ATC (CANN)",
                         description="Build the ATC command (and the AIPP config) for an ONNX YOLO model.")
    _add_common(p)
    p.add_argument("--output", required=True, metavar="OUT_BASENAME",
                   help="output basename: ATC writes OUT_BASENAME.om; the script is OUT_BASENAME.atc.sh")
    p.add_argument("--soc-version", default=atc.AUTO,
                   help="target chip, e.g. Ascend310P3, or 'auto' to ask npu-smi on this machine (default auto)")
    p.add_argument("--batch", metavar="B[,B...]",
                   help="one batch (fixed) or several (dynamic batch gears, e.g. 1,2,4,8); default: the "
                        "model's fixed batch, or 1")
    aipp = p.add_mutually_exclusive_group()
    aipp.add_argument("--aipp", dest="aipp", nargs="?", choices=("rgb", "yuv420sp"), const="rgb", default="rgb",
                      help="normalise on the NPU: the .om takes letterboxed uint8 RGB888 frames (rgb, the "
                           "default), or NV12 pictures the card's DVPP decoded and letterboxed (yuv420sp, for "
                           "cameras with decoder: dvpp), converted to RGB on the NPU as BT.601 limited range")
    aipp.add_argument("--no-aipp", dest="aipp", action="store_const", const=None,
                      help="keep the float NCHW input (the host normalises)")
    p.add_argument("--frame-color", choices=("rgb", "bgr"), default="rgb",
                   help="channel order of the frames yoloedge sends to the AIPP (its model.color; default rgb)")
    p.add_argument("--model-color", choices=("rgb", "bgr"), default="rgb",
                   help="channel order the model was trained on (Ultralytics/YOLOv5 rgb, YOLOX bgr; default rgb)")
    p.add_argument("--mean", type=float, nargs=3, metavar=("R", "G", "B"),
                   help="training mean per channel, as a fraction of 1 (e.g. 0.485 0.456 0.406); default 0")
    p.add_argument("--std", type=float, nargs=3, metavar=("R", "G", "B"),
                   help="training std per channel, as a fraction of 1 (e.g. 0.229 0.224 0.225); default 1")
    norm = p.add_mutually_exclusive_group()
    norm.add_argument("--normalize", dest="normalize", action="store_true", default=True,
                      help="the model takes pixel / 255 (YOLO; default)")
    norm.add_argument("--no-normalize", dest="normalize", action="store_false",
                      help="the model takes 0-255 pixels (YOLOX); --mean/--std are then in pixel units")
    p.add_argument("--input-format", choices=("nchw",), default="nchw",
                   help="layout of the ONNX input (ATC reads ONNX as NCHW; AIPP makes the .om input NHWC)")
    p.add_argument("--output-type", choices=atc.OUTPUT_TYPES, default="FP32",
                   help="data type of the .om outputs (default FP32)")
    p.set_defaults(func=run_atc)


def _add_trt(tools) -> None:
    p = tools.add_parser("trt", help="ONNX -> TensorRT engine with trtexec",
                         description="Build the trtexec command for an ONNX YOLO model.")
    _add_common(p)
    p.add_argument("--output", required=True, metavar="MODEL.engine", help="engine file to write")
    p.add_argument("--fp16", action="store_true", help="allow FP16 kernels")
    p.add_argument("--int8", action="store_true", help="allow INT8 kernels (a QDQ model or calibration needed)")
    p.add_argument("--batch", metavar="B|MIN,MAX|MIN,OPT,MAX",
                   help="batch range of the optimisation profile for dynamic-batch models (e.g. 1,4,8); "
                        "default 1")
    p.add_argument("--workspace-mb", type=int, metavar="N", help="builder workspace limit in MiB")
    p.add_argument("--trt-version", choices=trt.TRT_VERSIONS,
                   help="TensorRT of the machine that builds the engine, for the flags its trtexec takes "
                        "(8.6: --workspace, 10: --memPoolSize); default: the version of the trtexec here, "
                        "else of the installed tensorrt package, else 10")
    p.set_defaults(func=run_trt)


def _add_fp16(tools) -> None:
    p = tools.add_parser("fp16", help="float32 ONNX -> FP16 ONNX, checked against the float model",
                         description="Convert a float32 ONNX model to FP16 with ONNX Runtime's converter and "
                                     "check its boxes against the float model's on real images.")
    p.add_argument("model", metavar="MODEL.onnx", help="the float32 ONNX model")
    p.add_argument("-o", "--output", required=True, metavar="OUT.onnx", help="the FP16 model to write")
    p.add_argument("--fp16-io", action="store_true",
                   help="make the inputs and outputs float16 too (default: they stay float32)")
    _add_checks(p)
    p.set_defaults(func=run_fp16)


# -- atc ---------------------------------------------------------------------------------------

def run_atc(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    source, status = prepare_source(args, args.output, opsets.ATC, "atc", out, err)
    if source is None:
        return status
    try:
        model = inspect_onnx(source)
        opts = atc.AtcOptions(
            output=args.output, soc_version=atc.normalise_soc(args.soc_version), batches=parse_batches(args.batch),
            imgsz=tuple(args.imgsz) if args.imgsz else None, aipp=args.aipp is not None,
            aipp_input=args.aipp or "rgb", frame_color=args.frame_color,
            model_color=args.model_color, mean=atc.parse_triple(args.mean, (0.0, 0.0, 0.0)),
            std=atc.parse_triple(args.std, (1.0, 1.0, 1.0)), normalize=args.normalize,
            output_type=args.output_type)
        plan = atc.build_atc(model, opts)
        output_dir_ready(plan.script_path)
        atc.write_aipp(plan)
        write_script(plan.script_path, plan.argv, atc.script_comments(plan, model))
    except (ConvertError, OSError) as exc:
        print(f"yoloedge convert atc: {_message(exc)}", file=err)
        return EXIT_INPUT
    _describe_source(model, out)
    for note in plan.notes:
        print(f"note: {note}", file=err)
    if plan.aipp_path:
        print(f"wrote {plan.aipp_path}", file=out)
    print(f"wrote {plan.script_path}", file=out)
    print(shell_line(plan.argv), file=out)
    status = _run("atc", plan.argv, plan.script_path, args.dry_run, out, err,
                  install="the CANN toolkit (then source its set_env.sh)", log_path=plan.om_path[:-3] + ".atc.log",
                  parse=toollogs.parse_atc_log, env=atc.LOG_ENV)
    if status == 0 and not args.dry_run and not os.path.isfile(plan.om_path):
        print(f"yoloedge convert atc: atc finished but {plan.om_path} is missing", file=err)
        return 1
    if status == 0:
        print("\nyoloedge.yaml for this model:", file=out)
        print("\n".join(f"  {line}" for line in atc.config_hint(plan, model, opts)), file=out)
        print("then check it against the ONNX before deploying: yoloedge verify -c CONFIG --images ...",
              file=out)
    return status


# -- trt ---------------------------------------------------------------------------------------

def run_trt(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        version, how = trt_version(args)
    except (ConvertError, OSError) as exc:
        print(f"yoloedge convert trt: {_message(exc)}", file=err)
        return EXIT_INPUT
    source, status = prepare_source(args, args.output, opsets.TRT[version], "trt", out, err)
    if source is None:
        return status
    try:
        model = inspect_onnx(source)
        opts = trt.TrtOptions(output=args.output, fp16=args.fp16, int8=args.int8,
                              batches=trt.parse_profile(args.batch), imgsz=tuple(args.imgsz) if args.imgsz else None,
                              workspace_mb=args.workspace_mb, trt_version=version)
        plan = trt.with_tool(trt.build_trtexec(model, opts), find_tool("trtexec", (trt.JETSON_TRTEXEC,)))
        output_dir_ready(plan.script_path)
        write_script(plan.script_path, plan.argv, trt.script_comments(plan, model))
    except (ConvertError, OSError) as exc:
        print(f"yoloedge convert trt: {_message(exc)}", file=err)
        return EXIT_INPUT
    _describe_source(model, out)
    print(f"trtexec flags for TensorRT {version}{'.x' if version == '10' else ''} ({how})", file=out)
    for note in plan.notes:
        print(f"note: {note}", file=err)
    print(f"wrote {plan.script_path}", file=out)
    print(shell_line(plan.argv), file=out)
    reduced = args.fp16 or args.int8
    status = _run("trtexec", plan.argv, plan.script_path, args.dry_run, out, err,
                  install="TensorRT (JetPack on Jetson)", fallbacks=(trt.JETSON_TRTEXEC,),
                  log_path=plan.script_path[:-len(".sh")] + ".log",
                  parse=lambda text: toollogs.parse_trtexec_log(text, reduced))
    if status == 0 and not args.dry_run and not os.path.isfile(plan.engine_path):
        print(f"yoloedge convert trt: trtexec finished but {plan.engine_path} is missing", file=err)
        return 1
    if status == 0:
        print("\nyoloedge.yaml for this engine:", file=out)
        print("\n".join(f"  {line}" for line in trt.config_hint(plan, model)), file=out)
        print("then check it against the ONNX before deploying: yoloedge verify -c CONFIG --images ...",
              file=out)
    return status


def trt_version(args: argparse.Namespace) -> tuple[str, str]:
    """The trtexec flag family to write, and why: --trt-version, else what is installed here."""
    if args.trt_version:
        return args.trt_version, "--trt-version"
    return trt.detect_trt_version(find_tool("trtexec", (trt.JETSON_TRTEXEC,)))


# -- shared ------------------------------------------------------------------------------------

def _run(tool: str, argv: list[str], script: str, dry_run: bool, out: TextIO, err: TextIO,
         install: str, log_path: str, parse: Callable[[str], toollogs.SlowPaths],
         fallbacks: tuple[str, ...] = (), env: dict[str, str] | None = None) -> int:
    """Run the converter when it is here, its log saved and summarised; otherwise say how to run
    the script where it is."""
    executable = find_tool(tool, fallbacks)
    if dry_run:
        if executable is None:
            print(f"({tool} is not installed here: run {script} on a machine with {install})", file=out)
        return 0
    if executable is None:
        print(f"yoloedge convert: {tool} not found on PATH; install {install}, or copy the ONNX and "
              f"{script} to a machine that has it and run the script there", file=err)
        return EXIT_UNAVAILABLE
    out.flush()
    try:
        status = run_tool_logged(executable, argv, log_path, env)
    except ConvertError as exc:
        print(f"yoloedge convert: {exc}", file=err)
        return EXIT_UNAVAILABLE
    print(f"{tool} log: {log_path}", file=out)
    if status != 0:
        for line in log_tail(log_path):
            print(f"  {line}", file=err)
        print(f"yoloedge convert: {tool} failed with exit code {status}", file=err)
        return status if status >= 0 else 1  # killed by a signal
    summarise_log(log_path, parse, out)
    return 0


def summarise_log(log_path: str, parse: Callable[[str], toollogs.SlowPaths], out: TextIO) -> None:
    """One line per kind of slow path the converter's log names, or one saying there were none."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            lines = parse(f.read()).summary()
    except OSError as exc:
        print(f"cannot read {log_path}: {exc.strerror or exc}", file=out)
        return
    for line in lines or ["no operator fell back to a slow path (as far as the log says)"]:
        print(f"slow paths: {line}", file=out)


def _describe_source(model: SourceModel, out: TextIO) -> None:
    imgsz = model.metadata.imgsz
    print(f"{model.path}: input {model.input_name} {list(model.shape)} {model.dtype}"
          + (f", imgsz {imgsz[0]}x{imgsz[1]} (metadata)" if imgsz else ""), file=out)


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


# -- checks before converting: opset, simplify, fp16 -----------------------------------------

def prepare_source(args: argparse.Namespace, output: str, supported: opsets.OpsetRange, tool: str, out: TextIO,
                   err: TextIO) -> tuple[str | None, int]:
    """(the ONNX to convert, 0), after the opset warning and, with --simplify, the checked
    simplification; (None, exit code) when that failed."""
    warning = opsets.opset_warning(opsets.model_opset(args.onnx), supported)
    if warning:
        print(f"warning: {warning}", file=err)
    if not args.simplify:
        return args.onnx, 0
    stem = os.path.splitext(output[:-3] if output.lower().endswith(".om") else output)[0]
    return checked_simplify(args, args.onnx, stem + ".slim.onnx", f"convert {tool}", out, err)


def checked_simplify(args: argparse.Namespace, source: str, dst: str, who: str, out: TextIO,
                     err: TextIO) -> tuple[str | None, int]:
    if not module_installed("onnxslim"):
        print(f"yoloedge {who}: --simplify: {rewrite.SLIM_HINT}", file=err)
        return None, EXIT_UNAVAILABLE
    if not args.images:
        print(f"yoloedge {who}: --simplify needs --images to check the simplified graph on", file=err)
        return None, EXIT_INPUT
    try:
        output_dir_ready(dst)
        before, after = rewrite.simplify(source, dst)
        print(f"simplified {source}: {before} -> {after} nodes, {dst}", file=out)
        agreement = rewrite.compare(source, dst, _frames(args.images), args.format, args.max_score_diff, args.min_iou)
    except (ConvertError, OSError) as exc:
        print(f"yoloedge {who}: {_message(exc)}", file=err)
        return None, EXIT_INPUT
    if not _report(agreement, "simplified", out, err, who):
        return None, EXIT_DISAGREE
    return dst, 0


def run_fp16(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    who = "convert fp16"
    if not args.images:
        print(f"yoloedge {who}: --images is needed: the FP16 model is checked against the float model on them",
              file=err)
        return EXIT_INPUT
    source = args.model
    if args.simplify:
        slim, status = checked_simplify(args, source, os.path.splitext(args.output)[0] + ".slim.onnx", who, out, err)
        if slim is None:
            return status
        source = slim
    try:
        inspect_onnx(source)
        output_dir_ready(args.output)
        rewrite.to_fp16(source, args.output, fp16_io=args.fp16_io)
        before, after = os.path.getsize(source), os.path.getsize(args.output)
        print(f"wrote {args.output}: {after / 1e6:.2f} MB (float model {before / 1e6:.2f} MB), inputs/outputs "
              f"{'float16' if args.fp16_io else 'float32'}", file=out)
        agreement = rewrite.compare(args.model, args.output, _frames(args.images), args.format,
                                    args.max_score_diff, args.min_iou)
    except (ConvertError, OSError) as exc:
        print(f"yoloedge {who}: {_message(exc)}", file=err)
        return EXIT_INPUT
    return 0 if _report(agreement, "FP16", out, err, who) else EXIT_DISAGREE


def _frames(paths: list[str]) -> list:
    from ..verify import read_inputs

    frames = read_inputs(paths, frames_per_video=2)
    if frames.problems:
        raise ConvertError("; ".join(frames.problems))
    return frames.frames


def _report(agreement: rewrite.Agreement, what: str, out: TextIO, err: TextIO, who: str) -> bool:
    print(f"{what} vs original: {agreement.line()}", file=out)
    if agreement.agree:
        return True
    for problem in agreement.problems[:10]:
        print(f"  {problem}", file=err)
    print(f"yoloedge {who}: the {what} model's boxes disagree with the original's in "
          f"{len(agreement.problems)} case(s), beyond --max-score-diff / --min-iou: do not use it", file=err)
    return False

"""`yoloedge convert atc|trt`: build the vendor converter's command from the ONNX, and run it.

The command is printed and written into a script next to the output (OUT.atc.sh, MODEL.trtexec.sh),
so it can be rerun or copied to the machine that has the toolkit. It is run at once when the tool is
installed and --dry-run is not given.

Exit codes: 0 done (or, with --dry-run, written); 2 the model or the options cannot work; 69
(EX_UNAVAILABLE) the converter is not installed; otherwise the converter's own exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from ..convert import atc, trt
from ..convert.source import (ConvertError, SourceModel, find_tool, inspect_onnx, output_dir_ready, parse_batches,
                              run_tool, shell_line, write_script)

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


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--onnx", required=True, metavar="MODEL.onnx", help="the source ONNX model")
    p.add_argument("--imgsz", type=int, nargs=2, metavar=("H", "W"),
                   help="input size for models with open height/width (default: the model's imgsz metadata)")
    p.add_argument("--dry-run", action="store_true", help="print and write the command, do not run it")


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
    aipp.add_argument("--aipp", dest="aipp", action="store_true", default=True,
                      help="normalise on the NPU: the .om takes letterboxed uint8 RGB888 frames (default)")
    aipp.add_argument("--no-aipp", dest="aipp", action="store_false",
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


# -- atc ---------------------------------------------------------------------------------------

def run_atc(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        model = inspect_onnx(args.onnx)
        opts = atc.AtcOptions(
            output=args.output, soc_version=atc.normalise_soc(args.soc_version), batches=parse_batches(args.batch),
            imgsz=tuple(args.imgsz) if args.imgsz else None, aipp=args.aipp, frame_color=args.frame_color,
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
                  install="the CANN toolkit (then source its set_env.sh)")
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
        model = inspect_onnx(args.onnx)
        version, how = trt_version(args)
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
    status = _run("trtexec", plan.argv, plan.script_path, args.dry_run, out, err,
                  install="TensorRT (JetPack on Jetson)", fallbacks=(trt.JETSON_TRTEXEC,))
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
         install: str, fallbacks: tuple[str, ...] = ()) -> int:
    """Run the converter when it is here; otherwise say how to run the script where it is."""
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
        status = run_tool(executable, argv)
    except ConvertError as exc:
        print(f"yoloedge convert: {exc}", file=err)
        return EXIT_UNAVAILABLE
    if status != 0:
        print(f"yoloedge convert: {tool} failed with exit code {status}", file=err)
    return status if status >= 0 else 1  # killed by a signal


def _describe_source(model: SourceModel, out: TextIO) -> None:
    imgsz = model.metadata.imgsz
    print(f"{model.path}: input {model.input_name} {list(model.shape)} {model.dtype}"
          + (f", imgsz {imgsz[0]}x{imgsz[1]} (metadata)" if imgsz else ""), file=out)


def _message(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)

"""`yoloedge quantize`: a float ONNX model -> static INT8 (QDQ), with a report of what it costs.

The report compares the INT8 model's boxes with the float model's on frames it was not calibrated
on (precision, recall, mAP@0.5, the float boxes as truth) and both models' speed, measured in the
same run. See docs/hardware/converting-models.md, "INT8 with `yoloedge quantize`".

Exit codes: 0 done; 2 a usage error; 1 the model or the media cannot be used, or the quantizer
is not installed (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from ..errors import YoloedgeError
from ..postprocess import FORMATS
from ..redact import SECRETS, redact_text
from ..textsafe import printable

EXIT_FAILED = 1
EXIT_USAGE = 2


def add_parser(sub) -> None:
    from ..quantize.calibrate import INSTALL_HINT, METHODS

    p = sub.add_parser("quantize", help="float ONNX -> static INT8 (QDQ), with an agreement and speed report",
                       description="Quantize a float ONNX model to static INT8 (QDQ) with ONNX Runtime's "
                                   "quantizer, calibrated on frames letterboxed exactly as inference does, "
                                   "then report how its boxes agree with the float model's on held-out "
                                   "frames and how fast both run here. Needs " + INSTALL_HINT + ".")
    p.add_argument("model", metavar="MODEL", help="the float32 ONNX model")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the INT8 ONNX model to write")
    p.add_argument("--calibrate", required=True, metavar="PATH",
                   help="a folder of images or a video file to calibrate on")
    p.add_argument("--frames", type=int, default=32, metavar="N",
                   help="calibration frames, spread evenly over the source (default 32)")
    p.add_argument("--eval", dest="evaluate", metavar="PATH",
                   help="a folder or video for the report (default: the frames of --calibrate not "
                        "used for calibration)")
    p.add_argument("--eval-frames", type=int, default=20, metavar="N",
                   help="frames for the report, spread evenly (default 20)")
    p.add_argument("--format", choices=FORMATS, help="output layout, as model.format (default: recognised)")
    p.add_argument("--conf", type=float, default=0.25, help="minimum score of a box in the report (default 0.25)")
    p.add_argument("--iou", type=float, default=0.45, help="NMS IoU threshold (default 0.45)")
    p.add_argument("--method", choices=METHODS, default="minmax", help="calibration method (default minmax)")
    p.add_argument("--per-tensor", dest="per_channel", action="store_false",
                   help="one weight scale per tensor instead of per output channel")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads of both sessions (0: ORT default)")
    p.add_argument("--timing-runs", type=int, default=20, metavar="N",
                   help="timed runs per model for the speed figures (default 20)")
    p.add_argument("--tensorrt-table", metavar="FILE",
                   help="also write the calibration table trtexec --calib reads")
    p.add_argument("--amct", metavar="DIR",
                   help="also write the calibration tensors as float32 .bin files for Ascend's AMCT "
                        "and print its command")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    from ..quantize.workflow import Options
    from ..quantize.workflow import run as quantize

    for arg in (args.model, args.calibrate, args.evaluate):
        if arg:
            SECRETS.add_url(arg)
    if args.frames < 1 or args.eval_frames < 1 or args.timing_runs < 1 or args.threads < 0:
        print("yoloedge quantize: --frames, --eval-frames and --timing-runs must be at least 1, "
              "--threads at least 0", file=err)
        return EXIT_USAGE
    if not 0 <= args.conf <= 1 or not 0 <= args.iou <= 1:
        print("yoloedge quantize: --conf and --iou must lie between 0 and 1", file=err)
        return EXIT_USAGE
    options = Options(model=args.model, output=args.output, calibrate=args.calibrate, evaluate=args.evaluate,
                      frames=args.frames, eval_frames=args.eval_frames, format=args.format, conf=args.conf,
                      iou=args.iou, method=args.method, per_channel=args.per_channel, threads=args.threads,
                      timing_runs=args.timing_runs, tensorrt_table=args.tensorrt_table, amct=args.amct)
    try:
        report = quantize(options)
    except YoloedgeError as exc:
        print(printable(redact_text(f"yoloedge quantize: {exc}"), keep_newlines=True), file=err)
        return EXIT_FAILED
    if args.json:
        out.write(json.dumps(report.to_dict()) + "\n")
    else:
        out.write(format_report(report.to_dict()))
    return 0


def format_report(r: dict) -> str:
    """The report for a terminal: what was written, the agreement, the speed, the side outputs."""
    lines = [
        f"wrote {r['output']} (static INT8, QDQ; {r['method']} calibration on {r['calibration_frames']} "
        f"frames of {r['calibration_source']})",
        f"report on {r['eval_frames']} frames: {r['eval_kind']} ({r['eval_source']})",
        f"  agreement with the float model ({r['ap_definition']}):",
        f"    precision {r['precision']:.3f}  recall {r['recall']:.3f}  mAP@0.5 {r['map50']:.3f}  "
        f"({r['matched_boxes']} of {r['float_boxes']} float boxes matched; {r['int8_boxes']} INT8 boxes)",
        "    AP per class: " + ", ".join(f"{k} {v:.3f}" for k, v in r["ap_per_class"].items()),
        f"  speed here (model run alone, {r['timing_runs']} runs each, alternating):",
        f"    float {r['float_fps']:.1f} frames/s  INT8 {r['int8_fps']:.1f} frames/s  speedup {r['speedup']:.2f}x",
    ]
    if r["tensorrt_table"]:
        lines.append(f"TensorRT calibration table: {r['tensorrt_table']} ({r['tensorrt_tensors']} tensors); "
                     f"trtexec --int8 --calib={r['tensorrt_table']}")
    if r["amct_dir"]:
        lines.append(f"AMCT calibration input in {r['amct_dir']}; run where CANN is installed:")
        lines.append(f"  {r['amct_command']}")
    return "\n".join(printable(line) for line in lines) + "\n"

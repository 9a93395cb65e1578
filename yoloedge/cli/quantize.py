"""`yoloedge quantize`: a float ONNX model -> static INT8 (QDQ), with a report of what it costs.

The report compares the INT8 model's boxes with the float model's on frames it was not calibrated
on (precision, recall, mAP@0.5, the float boxes as truth) and both models' speed, measured in the
same run. See docs/hardware/converting-models.md, "INT8 with `yoloedge quantize`".

`--cameras [CONFIG]` calibrates on frames of the configured cameras instead of `--calibrate`:
the config is loaded as `yoloedge check` loads it, and the cameras are read with the daemon's
own sources (`quantize.cameras`).

Exit codes: 0 done; 2 a usage error; 1 the model or the media cannot be used (no camera gave a
frame), or the quantizer is not installed (one line on stderr, no traceback); 78 (EX_CONFIG)
the config of --cameras is not valid, printed as `yoloedge check` prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TextIO

from ..config.errors import EX_CONFIG, ConfigError
from ..config.loader import DEFAULT_PATH, load_config
from ..config.schema import CameraConfig, Config
from ..errors import YoloedgeError
from ..postprocess import FORMATS
from ..redact import SECRETS, redact_text
from ..textsafe import printable
from .check import environment

EXIT_FAILED = 1
EXIT_USAGE = 2
#: a live camera's calibration frames are this many seconds apart unless --interval says
DEFAULT_INTERVAL_S = 1.0


def add_parser(sub) -> None:
    from ..quantize.calibrate import INSTALL_HINT, METHODS

    p = sub.add_parser("quantize", help="float ONNX -> static INT8 (QDQ), with an agreement and speed report",
                       description="Quantize a float ONNX model to static INT8 (QDQ) with ONNX Runtime's "
                                   "quantizer, calibrated on frames letterboxed exactly as inference does, "
                                   "then report how its boxes agree with the float model's on held-out "
                                   "frames and how fast both run here. Needs " + INSTALL_HINT + ".")
    p.add_argument("model", metavar="MODEL", help="the float32 ONNX model")
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="the INT8 ONNX model to write")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--calibrate", metavar="PATH", help="a folder of images or a video file to calibrate on")
    source.add_argument("--cameras", nargs="?", const=DEFAULT_PATH, metavar="CONFIG",
                        help="calibrate on frames of the enabled cameras of this configuration file "
                             f"(default {DEFAULT_PATH}), spread over the cameras")
    p.add_argument("--camera", dest="camera_names", action="append", default=[], metavar="NAME",
                   help="with --cameras: only this camera (enabled or not); may be repeated")
    p.add_argument("--interval", type=float, metavar="S",
                   help=f"with --cameras: seconds between the frames of a live camera (default "
                        f"{DEFAULT_INTERVAL_S:g}; file and folder cameras give frames spread over their length)")
    p.add_argument("--env-file", action="append", default=[], metavar="FILE",
                   help="with --cameras: read ${VAR} values from this KEY=VALUE file too, as `yoloedge check` "
                        "does; may be repeated")
    p.add_argument("--frames", type=int, default=32, metavar="N",
                   help="calibration frames, spread evenly over the source or the cameras (default 32)")
    p.add_argument("--eval", dest="evaluate", metavar="PATH",
                   help="a folder or video for the report (default: frames of --calibrate, or of the "
                        "cameras, not used for calibration)")
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
    if args.cameras is None and (args.camera_names or args.interval is not None or args.env_file):
        print("yoloedge quantize: --camera, --interval and --env-file go with --cameras", file=err)
        return EXIT_USAGE
    if args.interval is not None and args.interval < 0:
        print("yoloedge quantize: --interval must be at least 0", file=err)
        return EXIT_USAGE
    cameras: tuple[CameraConfig, ...] = ()
    if args.cameras is not None:
        picked = pick_cameras(args, err)
        if isinstance(picked, int):
            return picked
        cameras = picked

    def warn(message: str) -> None:
        print(printable(redact_text(f"yoloedge quantize: warning: {message}")), file=err)

    options = Options(model=args.model, output=args.output, calibrate=args.calibrate, evaluate=args.evaluate,
                      frames=args.frames, eval_frames=args.eval_frames, format=args.format, conf=args.conf,
                      iou=args.iou, method=args.method, per_channel=args.per_channel, threads=args.threads,
                      timing_runs=args.timing_runs, tensorrt_table=args.tensorrt_table, amct=args.amct,
                      cameras=cameras, cameras_config=args.cameras,
                      interval_s=DEFAULT_INTERVAL_S if args.interval is None else args.interval)
    try:
        report = quantize(options, warn)
    except YoloedgeError as exc:
        print(printable(redact_text(f"yoloedge quantize: {exc}"), keep_newlines=True), file=err)
        return EXIT_FAILED
    if args.json:
        out.write(json.dumps(report.to_dict()) + "\n")
    else:
        out.write(format_report(report.to_dict()))
    return 0


def pick_cameras(args: argparse.Namespace, err: TextIO) -> tuple[CameraConfig, ...] | int:
    """The cameras --cameras and --camera name, or the exit code: 78 for a config error (printed
    as `yoloedge check` prints it), 2 for an unknown --camera, 1 when no camera is enabled."""
    try:
        config: Config = load_config(args.cameras, {**os.environ, **environment({}, args.env_file)})
    except ConfigError as exc:
        print(printable(str(exc), keep_newlines=True), file=err)  # messages quote the file's keys
        return EX_CONFIG
    by_name = {camera.name: camera for camera in config.cameras}
    if args.camera_names:
        unknown = [name for name in args.camera_names if name not in by_name]
        if unknown:
            print(printable(f"yoloedge quantize: {args.cameras} has no camera {', '.join(unknown)} "
                            f"(its cameras: {', '.join(by_name) or 'none'})"), file=err)
            return EXIT_USAGE
        return tuple(by_name[name] for name in dict.fromkeys(args.camera_names))
    enabled = tuple(camera for camera in config.cameras if camera.enabled)
    if not enabled:
        print(printable(f"yoloedge quantize: {args.cameras} has no enabled camera to calibrate on "
                        f"(name one with --camera NAME, or use --calibrate PATH)"), file=err)
        return EXIT_FAILED
    return enabled


def format_report(r: dict) -> str:
    """The report for a terminal: what was written, the agreement, the speed, the side outputs."""
    lines = [
        f"wrote {r['output']} (static INT8, QDQ; {r['method']} calibration on {r['calibration_frames']} "
        f"frames of {r['calibration_source']})",
        *_camera_lines(r),
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


def _camera_lines(r: dict) -> list[str]:
    """With --cameras: the frames each camera gave, and the cameras skipped."""
    lines = [f"  camera {name}: {n['calibration_frames']} calibration frames, {n['eval_frames']} report frames"
             for name, n in (r.get("cameras") or {}).items()]
    lines += [f"  camera {name} skipped: {why}" for name, why in (r.get("skipped_cameras") or {}).items()]
    return lines

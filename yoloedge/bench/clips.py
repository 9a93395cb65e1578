"""`yoloedge bench clip`: make a test clip at a camera's resolution from any video.

Camera streams are H.264; so is the clip when GStreamer's openh264 encoder is installed (Debian:
gstreamer1.0-plugins-bad). Otherwise OpenCV writes MPEG-4 Part 2 (mp4v), which decodes faster
than H.264: the pipeline benchmark says which codec its clip has, and measures the host's decode
ceiling on the same clip, so the comparison stays fair either way. `--codec` asks for one of them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import cv2

from ..errors import YoloedgeError


def add_parser(bsub) -> None:
    p = bsub.add_parser("clip", help="make a test clip at a given size (H.264 through GStreamer when available)",
                        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", required=True, help="any video OpenCV or GStreamer can decode")
    p.add_argument("--size", default="1920x1080", help="WIDTHxHEIGHT (default 1920x1080)")
    p.add_argument("-o", "--output", required=True, help="the clip to write (.mp4)")
    p.add_argument("--codec", choices=("auto", *CODECS), default="auto",
                   help="h264 (GStreamer's openh264), mpeg4 (MPEG-4 Part 2, OpenCV), or auto: H.264 where "
                        "it can be made, else MPEG-4 (default)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        print("yoloedge bench clip: --size is WIDTHxHEIGHT", file=sys.stderr)
        return 2
    try:
        codec = _make(args.source, args.output, width, height, args.codec)
    except YoloedgeError as exc:
        print(f"yoloedge bench clip: {exc}", file=sys.stderr)
        return 1
    cap = cv2.VideoCapture(args.output)
    frames, fps = int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), cap.get(cv2.CAP_PROP_FPS)
    cap.release()
    print(f"{args.output}: {width}x{height}, {frames} frames at {fps:.2f} fps, {codec}")
    return 0


#: the codecs a clip can be made in, and what each needs
CODECS = ("h264", "mpeg4")
CODEC_HINTS = {"h264": "needs gst-launch-1.0 and the openh264enc element (Debian: gstreamer1.0-plugins-bad)",
               "mpeg4": "OpenCV could not open the source or write MPEG-4 Part 2"}


def _make(source: str, output: str, width: int, height: int, codec: str) -> str:
    if codec == "auto":
        return make_clip(source, output, width, height)
    made = make_codec_clip(source, output, width, height, codec)
    if made is None:
        raise YoloedgeError(f"cannot make {codec} here: {CODEC_HINTS[codec]}")
    return made


def make_clip(source: str, output: str, width: int, height: int) -> str:
    """Scale `source` to width x height into `output`; returns the codec used: H.264 where it can
    be made, else MPEG-4 Part 2."""
    made = make_codec_clip(source, output, width, height, "h264") or make_codec_clip(source, output, width, height,
                                                                                     "mpeg4")
    if made is None:
        raise YoloedgeError(f"cannot make a clip from {source}: {CODEC_HINTS['mpeg4']}")
    return made if made.startswith("H.264") else f"{made}; install GStreamer's openh264 for H.264"


def make_codec_clip(source: str, output: str, width: int, height: int, codec: str) -> str | None:
    """Scale `source` to width x height into `output` in `codec` (one of CODECS); returns the
    codec's description, or None when it cannot be made here (see CODEC_HINTS)."""
    if codec == "mpeg4":
        return "MPEG-4 Part 2 (OpenCV mp4v)" if _opencv_mp4v(source, output, width, height) else None
    gst = shutil.which("gst-launch-1.0")
    if gst and _has_element("openh264enc"):
        pipeline = (f"filesrc location={_quote(source)} ! decodebin ! videoconvert ! videoscale ! "
                    f"video/x-raw,width={width},height={height} ! openh264enc bitrate=8000000 ! h264parse ! "
                    f"mp4mux ! filesink location={_quote(output)}")
        result = subprocess.run([gst, "-q", *_split(pipeline)], capture_output=True, text=True)
        if result.returncode == 0 and Path(output).stat().st_size > 0:
            return "H.264 (openh264)"
    return None


def _opencv_mp4v(source: str, output: str, width: int, height: int) -> int:
    """Frames written."""
    written = 0
    cap = cv2.VideoCapture(source)
    fps = cap.get(cv2.CAP_PROP_FPS) or 30.0
    writer = cv2.VideoWriter(output, cv2.VideoWriter.fourcc(*"mp4v"), fps, (width, height))
    try:
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            writer.write(cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR))
            written += 1
    finally:
        cap.release()
        writer.release()
    return written


def _has_element(name: str) -> bool:
    inspect = shutil.which("gst-inspect-1.0")
    return inspect is not None and subprocess.run([inspect, name], capture_output=True).returncode == 0


def _quote(path: str) -> str:
    return '"' + str(Path(path).resolve()).replace('"', '\\"') + '"'


def _split(pipeline: str) -> list[str]:
    import shlex

    return shlex.split(pipeline)

"""`yoloedge-ctl watch` and `yoloedge-ctl snapshot`: what the daemon sees, from its control socket.

    yoloedge-ctl watch [CAMERA] [--json]        one line per published detection message
    yoloedge-ctl snapshot CAMERA -o FILE.jpg    the latest processed frame, boxes drawn

Both ask the daemon itself, not MQTT, so they work without a broker or its credentials.
`watch` runs until Ctrl-C; if it reads too slowly the daemon drops the oldest lines for it
(never slowing the pipeline) and it says how many. Exit codes besides ctl's own (0, 3, 4):
5 no camera of that name, 6 the camera has no processed frame yet (still connecting).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import json
import sys
from typing import Callable

from ..control.client import request, stream
from ..demo.runner import detection_line
from ..files import write_atomically
from ..textsafe import printable

EXIT_OK = 0
EXIT_NOT_RUNNING = 3
EXIT_UNKNOWN = 4
EXIT_NO_SUCH_CAMERA = 5
EXIT_NO_FRAME_YET = 6
SNAPSHOT_TIMEOUT_S = 10.0
WATCH_CONNECT_TIMEOUT_S = 5.0
_MISS_EXIT = {"unknown_camera": EXIT_NO_SUCH_CAMERA, "no_frame_yet": EXIT_NO_FRAME_YET}


def add_parsers(sub: argparse._SubParsersAction, options: Callable[..., argparse.ArgumentParser]) -> None:
    """`options(after_command=True)`: ctl's global options, accepted after the command too."""
    watch = sub.add_parser("watch", parents=[options(after_command=True)],
                           help="print detections live as the daemon publishes them (Ctrl-C stops)")
    watch.add_argument("camera", nargs="?", help="only this camera (default: all)")
    watch.add_argument("--json", action="store_true", help="print each detection message as JSON, one per line")
    snap = sub.add_parser("snapshot", parents=[options(after_command=True)],
                          help="save a camera's latest processed frame with its boxes drawn")
    snap.add_argument("camera", help="camera name")
    snap.add_argument("-o", "--output", required=True, help="JPEG file to write")


def run(args: argparse.Namespace, socket_path: str) -> int:
    if args.command == "watch":
        return watch(socket_path, args.camera, args.json, args.timeout or WATCH_CONNECT_TIMEOUT_S)
    return snapshot(socket_path, args.camera, args.output, args.timeout or SNAPSHOT_TIMEOUT_S)


def watch(socket_path: str, camera: str | None, as_json: bool, timeout: float) -> int:
    lines = stream(socket_path, {"cmd": "watch", "camera": camera}, timeout=timeout)
    try:
        reply = next(lines)
        if not reply.get("ok"):
            _say(f"cannot watch: {reply.get('error')}")
            return _MISS_EXIT.get(str(reply.get("reason")), EXIT_UNKNOWN)
        for line in lines:
            if line.get("event") == "dropped":
                _say(f"too slow: the daemon dropped {line.get('total')} message(s) for this watch so far")
            elif line.get("event") == "detections" and isinstance(line.get("message"), dict):
                message = line["message"]
                print(json.dumps(message) if as_json else watch_line(message), flush=True)
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        lines.close()
    _say("the daemon ended the watch (stopping?)")
    return EXIT_NOT_RUNNING


def watch_line(message: dict) -> str:
    """'12:04:31.250 [door frame   812  latency  41.5 ms] person 0.91 [..], ... +3 more'."""
    ts = str(message.get("ts", ""))
    clock = ts[11:23] if len(ts) >= 23 else ts  # the time of day of the ISO timestamp (UTC)
    try:
        return printable(f"{clock} {detection_line(message)}")
    except (KeyError, TypeError, ValueError):  # a newer daemon's message: show it rather than fail
        return printable(f"{clock} {json.dumps(message)}")


def snapshot(socket_path: str, camera: str, output: str, timeout: float) -> int:
    reply = request(socket_path, {"cmd": "snapshot", "camera": camera}, timeout=timeout)
    if not reply.get("ok"):
        _say(str(reply.get("error")))
        return _MISS_EXIT.get(str(reply.get("reason")), EXIT_UNKNOWN)
    try:
        jpeg = base64.b64decode(str(reply.get("jpeg_base64", "")), validate=True)
    except (binascii.Error, ValueError):
        _say("the daemon's snapshot is not valid base64")
        return EXIT_UNKNOWN
    try:
        write_atomically(output, jpeg)  # a viewer reloading it never sees half an image
    except OSError as exc:
        _say(f"cannot write {output}: {exc.strerror or exc}")
        return EXIT_UNKNOWN
    count = len(reply.get("detections") or [])
    print(printable(f"{output}: camera {camera}, frame {reply.get('frame')} at {reply.get('ts')}, "
                    f"{reply.get('width')}x{reply.get('height')}, {count} object(s)"))
    return EXIT_OK


def _say(text: str) -> None:
    print(printable(f"yoloedge-ctl: {text}"), file=sys.stderr)

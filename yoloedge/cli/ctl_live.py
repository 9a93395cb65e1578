"""`yoloedge-ctl watch`, `snapshot` and `events`: what the daemon sees, from its control socket.

    yoloedge-ctl watch [CAMERA] [--json]           one line per published detection message
    yoloedge-ctl watch [CAMERA] --events [--json]  one line per event message (new, update, end)
    yoloedge-ctl snapshot CAMERA -o FILE.jpg       the latest processed frame, boxes drawn
    yoloedge-ctl events [CAMERA] [--limit N] [--json]   the recent events, newest first

All ask the daemon itself, not MQTT, so they work without a broker or its credentials.
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
from ..control.statustext import cell, format_duration, format_table
from ..demo.runner import detection_line
from ..events.recent import MAX_LIMIT, read_limit
from ..files import write_atomically
from ..textsafe import printable
from ..timeutil import utc_timestamp

EXIT_OK = 0
EXIT_NOT_RUNNING = 3
EXIT_UNKNOWN = 4
EXIT_NO_SUCH_CAMERA = 5
EXIT_NO_FRAME_YET = 6
SNAPSHOT_TIMEOUT_S = 10.0
EVENTS_TIMEOUT_S = 5.0
WATCH_CONNECT_TIMEOUT_S = 5.0
_MISS_EXIT = {"unknown_camera": EXIT_NO_SUCH_CAMERA, "no_frame_yet": EXIT_NO_FRAME_YET}


def add_parsers(sub: argparse._SubParsersAction, options: Callable[..., argparse.ArgumentParser]) -> None:
    """`options(after_command=True)`: ctl's global options, accepted after the command too."""
    watch = sub.add_parser("watch", parents=[options(after_command=True)],
                           help="print detections live as the daemon publishes them (Ctrl-C stops)")
    watch.add_argument("camera", nargs="?", help="only this camera (default: all)")
    watch.add_argument("--json", action="store_true", help="print each message as JSON, one per line")
    watch.add_argument("--events", action="store_true",
                       help="the event messages (new, update, end) instead of the detections")
    snap = sub.add_parser("snapshot", parents=[options(after_command=True)],
                          help="save a camera's latest processed frame with its boxes drawn")
    snap.add_argument("camera", help="camera name")
    snap.add_argument("-o", "--output", required=True, help="JPEG file to write")
    events = sub.add_parser("events", parents=[options(after_command=True)],
                            help="the recent events (newest first) and whether a snapshot of each is kept")
    events.add_argument("camera", nargs="?", help="only this camera (default: all)")
    events.add_argument("--limit", type=_limit, default=None, help=f"at most this many (1..{MAX_LIMIT}, default 50)")
    events.add_argument("--json", action="store_true", help="print the daemon's reply as JSON")


COMMANDS = ("watch", "snapshot", "events")


def _limit(text: str) -> int:
    value = read_limit(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_LIMIT}, got {text!r}")
    return value


def run(args: argparse.Namespace, socket_path: str) -> int:
    if args.command == "watch":
        return watch(socket_path, args.camera, args.json, args.timeout or WATCH_CONNECT_TIMEOUT_S, args.events)
    if args.command == "events":
        return events(socket_path, args.camera, args.limit, args.json, args.timeout or EVENTS_TIMEOUT_S)
    return snapshot(socket_path, args.camera, args.output, args.timeout or SNAPSHOT_TIMEOUT_S)


def watch(socket_path: str, camera: str | None, as_json: bool, timeout: float, events: bool = False) -> int:
    payload = {"cmd": "watch", "camera": camera, **({"events": True} if events else {})}
    kind, show = ("events", event_line) if events else ("detections", watch_line)
    lines = stream(socket_path, payload, timeout=timeout)
    try:
        reply = next(lines)
        if not reply.get("ok"):
            _say(f"cannot watch: {reply.get('error')}")
            return _MISS_EXIT.get(str(reply.get("reason")), EXIT_UNKNOWN)
        for line in lines:
            if line.get("event") == "dropped":
                _say(f"too slow: the daemon dropped {line.get('total')} message(s) for this watch so far")
            elif line.get("event") == kind and isinstance(line.get("message"), dict):
                message = line["message"]
                print(json.dumps(message) if as_json else show(message), flush=True)
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


def event_line(message: dict) -> str:
    """'12:04:31.250 [gate] update lq3x2a-17 person 0.91 in yard; gate in': frame time (UTC),
    camera, type, id, label, score, the zones it is in now and its crossings so far."""
    try:
        clock = utc_timestamp(float(message["frame_time"]))[11:23]
        parts = [f"{clock} [{message['camera']}] {message['type']} {message['id']} {message['label']} "
                 f"{float(message['score']):.2f}"]
        if message.get("current_zones"):
            parts.append("in " + ",".join(map(str, message["current_zones"])))
        if message.get("crossings"):
            parts.append(", ".join(f"{c['line']} {c['direction']}" for c in message["crossings"]))
        return printable("; ".join(parts))
    except (KeyError, TypeError, ValueError, OverflowError, OSError):  # a newer daemon's message
        return printable(json.dumps(message))


def events(socket_path: str, camera: str | None, limit: int | None, as_json: bool, timeout: float) -> int:
    payload = {"cmd": "events", "camera": camera, **({"limit": limit} if limit is not None else {})}
    reply = request(socket_path, payload, timeout=timeout)
    if not reply.get("ok"):
        _say(str(reply.get("error")))
        return _MISS_EXIT.get(str(reply.get("reason")), EXIT_UNKNOWN)
    found = reply.get("events") if isinstance(reply.get("events"), list) else []
    if as_json:
        print(json.dumps(reply, indent=2))
    elif not found:
        print("no events" + (printable(f" of camera {camera}") if camera else "") + " yet")
    else:
        print("\n".join(format_events([e for e in found if isinstance(e, dict)])))
    return EXIT_OK


EVENT_HEADERS = ("STARTED (UTC)", "CAMERA", "EVENT", "LABEL", "STATE", "FOR", "TOP", "IN NOW", "ENTERED",
                 "CROSSINGS", "SNAPSHOT")


def format_events(found: list[dict]) -> list[str]:
    """The table `yoloedge-ctl events` prints: one row per event, newest first."""
    return format_table(EVENT_HEADERS, [_event_row(e) for e in found], right=(5, 6))


def _event_row(event: dict) -> list[str]:
    start = event.get("start_time")
    last = event.get("end_time") if event.get("end_time") is not None else event.get("frame_time")
    try:
        started = utc_timestamp(float(start)).replace("T", " ")[:19] if start is not None else None
        lasted = format_duration(float(last) - float(start)) if start is not None and last is not None else None
    except (TypeError, ValueError, OverflowError, OSError):  # a newer daemon's message: shown as unknown
        started = lasted = None
    crossings = [f"{c.get('line')} {c.get('direction')}" for c in event.get("crossings") or [] if isinstance(c, dict)]
    jpeg = event.get("jpeg")
    shot = f"{jpeg.get('bytes', 0) / 1000:.0f} kB" if isinstance(jpeg, dict) else None
    return [cell(started), cell(event.get("camera")), cell(event.get("id")), cell(event.get("label")),
            "ended" if event.get("type") == "end" else "active", cell(lasted), cell(event.get("top_score"), "{:.2f}"),
            cell(_names(event.get("current_zones"))), cell(_names(event.get("entered_zones"))),
            cell(", ".join(crossings) or None), cell(shot)]


def _names(value: object) -> str | None:
    if not isinstance(value, list) or not value:
        return None
    return ",".join(map(str, value))


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

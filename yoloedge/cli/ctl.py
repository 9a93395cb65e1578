"""`yoloedge-ctl`: talk to a running daemon over its control socket.

    yoloedge-ctl [--socket PATH | -c CONFIG] [--timeout S] status [--json]
    yoloedge-ctl [--socket PATH | -c CONFIG] [--timeout S] reload
    yoloedge-ctl [--socket PATH | -c CONFIG] watch [CAMERA] [--events] [--json]   (see `cli.ctl_live`)
    yoloedge-ctl [--socket PATH | -c CONFIG] snapshot CAMERA -o FILE.jpg
    yoloedge-ctl [--socket PATH | -c CONFIG] reset-counts CAMERA [LINE|ZONE]
    yoloedge-ctl [--socket PATH | -c CONFIG] events [CAMERA] [--limit N] [--json]

The global options go before or after the command (`yoloedge-ctl status -c CONFIG`). With
`-c CONFIG` the socket path is the config file's `control.socket`; without it (or without -c),
$XDG_RUNTIME_DIR/yoloedge/control.sock where this user's daemon made it, else
/run/yoloedge/control.sock (see `yoloedge.control.location`).

Exit codes follow the LSB status convention:
    0  running and healthy (reload: accepted)
    1  running but degraded: `daemon.healthy` is false (reload: rejected by the daemon)
    2  usage error, or the config file given with -c is unreadable
    3  not running (no control socket, or nothing accepting on it)
    4  status unknown: permission denied on the socket (join the 'yoloedge' group or use
       sudo), no answer in time, or an answer that makes no sense

Requests and replies are one JSON line each (see `yoloedge.control.server`).

`{"cmd": "status"}` is answered with this dict (`status --json` prints it as is):

    {"ok": true,
     "daemon": {"state": "starting" | "running" | "reloading" | "stopping",
                "pid": int, "version": str, "uptime_s": float,
                "config": str (path of the config file), "generation": int (1 at start-up,
                +1 per applied reload), "config_error": str | null (why the last reload was
                rejected; the previous config stays in effect), "healthy": bool,
                "problems": [str]},
     "accelerators": [{"name": str, "backend": str, "device": str, "model": str, "batch": int,
                       "state": str, "healthy": bool, "inferences_per_s": float,
                       "frames_per_s": float, "utilisation": float (device busy / wall over the
                       last seconds, 0..1), "busy_s": float (device seconds since start),
                       "p50_ms": float | null, "p99_ms": float | null, "batch_p50": float | null,
                       "queue_depth": int (frames taken in, not yet on the device),
                       "in_flight": bool, "errors": int, "frames_lost": int, "restarts": int,
                       "copy_in_p50_ms" / "execute_p50_ms" / "copy_out_p50_ms": float | null (the
                       steps of a batch, where the backend times them apart: Ascend),
                       "description": str, "runtime": {"cann": str, "soc": str, "model_soc": str,
                       "problems": [str]} | null (Ascend)}],
     "cameras": [{"name": str, "url": str (display form: no credentials), "state": str,
                  "fps_in": float, "fps_out": float, "drops": int, "reconnects": int,
                  "stalls": int, "images_skipped": int | null (image folders: files refused),
                  "jpeg_decoder": str | null (image folders and HTTP cameras: nvimgcodec, nvjpeg or cpu),
                  "decoder": str (video: opencv, pyav, gstreamer, jetson, vaapi or nvidia; `auto` once resolved),
                  "decoder_reason": str | null (why: as configured, or what auto passed over; the RTSP
                                    chain and GStreamer version),
                  "last_frame_age_s": float | null,
                  "latency_p50_ms": float | null, "latency_p99_ms": float | null,
                  "error": str | null,
                  "zones": [{"name": str, "polygon": [[x, y]] (fractions of the frame),
                             "objects": {label: n} (inside now), "entered": {label: n}}],
                  "lines": [{"name": str, "points": [[Ax, Ay], [Bx, By]], "in": {label: n},
                             "out": {label: n}}]}],
     "sinks": {name: {"errors": int, "last_error": str | null, ...}} (each result sink and
              stage: mqtt_detections, mqtt_events, event_log, homeassistant, mqtt_state, watch,
              snapshots, metrics, tracking; one that fails does not stop the others),
     "mqtt": {"connected": bool, "broker": str ("host:port"), "queued": int, "queued_bytes": int,
              "spooled": int | null (messages in mqtt.spool_dir; null without a spool),
              "delivered": int, "dropped": int, "ack_stalled": bool (connected, but nothing
              acknowledged for a while), "unstable": bool (the broker keeps closing fresh
              connections), "backlog": int (waiting to be sent), "drained": int (backlog
              messages sent at drain_rate after reconnects), "superseded": int (retained copies
              skipped for a newer one), "drain_rate": float, "reconnect_delay_s": float | null
              (the wait before the current attempt), "last_error": str | null (the error that holds, else the most
              recent one), "last_error_at": str | null (UTC, when it was last reported),
              "error_active": bool (whether it still holds)},
     "http": {"listen": str | null (null: off or not bound), "accept_failures": int,
              "refused": int (clients told "out of file descriptors" and closed),
              "last_accept_failure": str | null (UTC), "accept_failing": bool,
              "accept_error": str | null},
     "control": {"socket": str | null, and the same accept counts},  (the counts only while listening)
     "events": {"cameras": {name: {"events": int, "snapshots": int, "snapshot_bytes": int,
                                   "budget_bytes": int}},
                "encoded": int, "skipped": int, "evicted": int}}  (see `events.recent.EventLog.stats`)

The daemon may add keys (e.g. `daemon.device_id`, `daemon.restart_needed_for`: changed keys
that only a restart applies); `status` shows what it knows and ignores the rest.

`{"cmd": "reload"}` is answered once the daemon has tried the reload:
`{"ok": bool, "generation": int, "reloaded": bool, "config_error": str | null}` --
ok false means the new config was rejected (config_error says why; the old one stays).
`{"cmd": "events", "camera": str | null, "limit": int (1..1000, default 50)}` is answered with
`{"ok": true, "camera": str | null, "events": [...]}`: the latest message of each recent event,
newest first, as published on MQTT, plus `"jpeg": {"frame_time", "score", "box", "bytes"} | null`
(the best shot kept, `GET /api/events/{id}/snapshot.jpg`); a camera that is not configured gets
`{"ok": false, "reason": "unknown_camera", ...}` (see `events.recent`).
Any request the daemon cannot serve gets `{"ok": false, "error": str}`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Mapping

import yaml

from ..config.schema import ControlConfig
from ..control.client import ControlError, NotRunning, PermissionDenied, request
from ..control.location import client_socket
from ..control.statustext import cell, format_status
from ..redact import redact_text
from ..textsafe import printable
from . import ctl_live

DEFAULT_SOCKET = ControlConfig().socket

EXIT_OK = 0
EXIT_DEGRADED = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
EXIT_UNKNOWN = 4
EXIT_PERMISSION_DENIED = EXIT_UNKNOWN  # LSB: status unknown to this user

STATUS_TIMEOUT_S = 5.0
#: the daemon answers a reload only once it has been applied or rejected (it waits up to 30 s).
RELOAD_TIMEOUT_S = 35.0


class ConfigFileError(Exception):
    """The -c file cannot be read or has no usable `control.socket`."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yoloedge-ctl", parents=[global_options()],
                                     description="Inspect or reload a running yoloedge daemon.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    status = sub.add_parser("status", parents=[global_options(after_command=True)],
                            help="daemon, accelerators, cameras and MQTT at a glance")
    status.add_argument("--json", action="store_true", help="print the daemon's status as JSON")
    sub.add_parser("reload", parents=[global_options(after_command=True)],
                   help="re-read the config file (like systemctl reload)")
    reset = sub.add_parser("reset-counts", parents=[global_options(after_command=True)],
                           help="zero a camera's line and zone counts (all, or one by name)")
    reset.add_argument("camera", help="the camera's name")
    reset.add_argument("name", nargs="?", default=None, help="one line or zone (default: all of them)")
    ctl_live.add_parsers(sub, global_options)
    return parser


def global_options(after_command: bool = False) -> argparse.ArgumentParser:
    """--socket, -c and --timeout, for `parents=` of the top parser and of every subcommand, so
    that `yoloedge-ctl status -c FILE` works as well as `yoloedge-ctl -c FILE status`.

    After the command the defaults are SUPPRESS: argparse copies a subparser's defaults over what
    the top parser already read, which would silently drop `-c FILE status`'s FILE.
    """
    default = argparse.SUPPRESS if after_command else None
    options = argparse.ArgumentParser(add_help=False)
    where = options.add_mutually_exclusive_group()
    where.add_argument("--socket", default=default,
                       help="control socket (default: the config's control.socket, else "
                            f"{DEFAULT_SOCKET} or $XDG_RUNTIME_DIR/yoloedge/control.sock)")
    where.add_argument("-c", "--config", default=default,
                       help="read the control socket path from this config file")
    options.add_argument("--timeout", type=_seconds, default=default,
                         help=f"seconds to wait for the daemon (default {STATUS_TIMEOUT_S:g}; "
                              f"reload {RELOAD_TIMEOUT_S:g})")
    return options


def _seconds(text: str) -> float:
    """--timeout: a positive, finite number of seconds (NaN or -1 would fail deep in the socket)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"must be between 0 and 86400 seconds, got {text!r}")
    return value


def socket_from_config(path: str, environ: Mapping[str, str] | None = None) -> str:
    """`control.socket` from the YAML at `path`; where the key is absent, the socket a daemon
    without it uses (`control.location.client_socket`, from `environ`, default os.environ).

    Reads only that key: ctl must work even when the rest of the file would not validate
    (that is exactly when an operator needs `status` to see the reload error).
    """
    try:
        with open(path, encoding="utf-8") as fh:
            document = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigFileError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"config file {path} is not valid YAML: {exc}") from exc
    if document is not None and not isinstance(document, dict):
        raise ConfigFileError(f"config file {path}: expected a mapping at the top level")
    control = (document or {}).get("control")
    if control is not None and not isinstance(control, dict):
        raise ConfigFileError(f"config file {path}: `control` must be a mapping")
    if control is None or "socket" not in control:
        return client_socket(os.environ if environ is None else environ)
    socket_path = control["socket"]
    if not isinstance(socket_path, str) or not socket_path:
        raise ConfigFileError(f"config file {path}: `control.socket` must be a path")
    return socket_path


# ---------------------------------------------------------------------------------------------
# Commands


def _status(socket_path: str, timeout: float, as_json: bool) -> int:
    reply = redacted(request(socket_path, {"cmd": "status"}, timeout=timeout))
    if not reply.get("ok"):
        print(printable(f"yoloedge-ctl: the daemon could not report its status: {reply.get('error')}"),
              file=sys.stderr)
        return EXIT_UNKNOWN
    print(json.dumps(reply, indent=2) if as_json else format_status(reply))
    return EXIT_OK if (reply.get("daemon") or {}).get("healthy") else EXIT_DEGRADED


def redacted(reply: Any) -> Any:
    """`reply` with every string in its display form (see `redact_text`): the daemon already sends
    URLs without credentials, but a daemon of another version, or an error text that quotes a
    URL, must not put one on an operator's screen or in a support ticket."""
    if isinstance(reply, str):
        return redact_text(reply)
    if isinstance(reply, dict):
        return {key: redacted(value) for key, value in reply.items()}
    if isinstance(reply, list):
        return [redacted(value) for value in reply]
    return reply


def _reload(socket_path: str, timeout: float) -> int:
    reply = redacted(request(socket_path, {"cmd": "reload"}, timeout=timeout))
    generation = cell(reply.get("generation"))
    if not reply.get("ok"):
        why = reply.get("config_error") or reply.get("error") or "no reason given"
        print(printable(f"yoloedge-ctl: reload rejected, still running generation {generation}:\n{why}",
                        keep_newlines=True), file=sys.stderr)
        return EXIT_DEGRADED
    if reply.get("reloaded") is False:
        print(f"reload requested; still running generation {generation} (see `yoloedge-ctl status`)")
    else:
        print(f"reloaded (generation {generation})")
    return EXIT_OK


def _reset_counts(socket_path: str, timeout: float, camera: str, name: str | None) -> int:
    """Exit 0 when zeroed, 1 when the daemon refused (unknown camera, line or zone: it says which
    it has)."""
    reply = redacted(request(socket_path, {"cmd": "reset-counts", "camera": camera, "name": name}, timeout=timeout))
    if not reply.get("ok"):
        print(printable(f"yoloedge-ctl: {reply.get('error') or 'reset refused'}"), file=sys.stderr)
        return EXIT_DEGRADED
    reset = reply.get("reset") or []
    print(printable(f"camera {camera}: counts zeroed for {', '.join(map(str, reset)) or 'nothing'}"))
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.socket and args.config:  # one on each side of the command: the group cannot see both
        parser.error("argument -c/--config: not allowed with argument --socket")
    try:
        socket_path = args.socket or (socket_from_config(args.config) if args.config
                                      else client_socket(os.environ))
    except ConfigFileError as exc:
        print(f"yoloedge-ctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "status":
            return _status(socket_path, args.timeout or STATUS_TIMEOUT_S, args.json)
        if args.command in ctl_live.COMMANDS:
            return ctl_live.run(args, socket_path)
        if args.command == "reset-counts":
            return _reset_counts(socket_path, args.timeout or STATUS_TIMEOUT_S, args.camera, args.name)
        return _reload(socket_path, args.timeout or RELOAD_TIMEOUT_S)
    except NotRunning as exc:
        print(f"yoloedge-ctl: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except PermissionDenied as exc:
        print(f"yoloedge-ctl: {exc}", file=sys.stderr)
        return EXIT_PERMISSION_DENIED
    except ControlError as exc:
        print(f"yoloedge-ctl: {exc}", file=sys.stderr)
        return EXIT_UNKNOWN


if __name__ == "__main__":
    raise SystemExit(main())

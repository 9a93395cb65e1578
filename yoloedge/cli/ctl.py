"""`yoloedge-ctl`: talk to a running daemon over its control socket.

Exit codes follow the LSB status convention: 0 running and healthy, 1 degraded, 3 not running.
"""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_SOCKET = "/run/yoloedge/control.sock"
EXIT_NOT_RUNNING = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="yoloedge-ctl", description="Inspect a running yoloedge daemon.")
    parser.add_argument("--socket", default=DEFAULT_SOCKET, help=f"control socket (default {DEFAULT_SOCKET})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    status = sub.add_parser("status", help="daemon, accelerators, cameras and MQTT at a glance")
    status.add_argument("--json", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not os.path.exists(args.socket):
        print(f"yoloedge is not running (no control socket at {args.socket})", file=sys.stderr)
        return EXIT_NOT_RUNNING
    print("yoloedge-ctl: this build has no daemon control protocol yet", file=sys.stderr)
    return EXIT_NOT_RUNNING


if __name__ == "__main__":
    raise SystemExit(main())

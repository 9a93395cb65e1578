"""`yoloedge run`: start the daemon (normally from systemd)."""

from __future__ import annotations

import argparse
import os

DEFAULT_CONFIG = "/etc/yoloedge/yoloedge.yaml"


def add_parser(sub) -> None:
    p = sub.add_parser("run", help="run the detection daemon",
                       description="Run the daemon: cameras -> accelerators -> MQTT. "
                                   "Exits 78 on a configuration error before touching any device.")
    p.add_argument("-c", "--config", default=DEFAULT_CONFIG, help=f"configuration file (default {DEFAULT_CONFIG})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..daemon import run_daemon

    return run_daemon(args.config, os.environ)

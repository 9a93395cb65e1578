"""`yoloedge demo`: the daemon on the CPU with the demo model and camera, a private mosquitto on a
free port, and a subscriber that prints one short line per detection message as it arrives; at the
end (after --seconds, or on Ctrl-C) the output of `yoloedge-ctl status`, where it stays on screen.

Everything lives in a temporary directory and is torn down on Ctrl-C (or after --seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from ..localbroker import HOST, INSTALL_HINT, find_mosquitto, free_port, start_broker
from ..textsafe import printable
from . import LABELS, MODEL, clip_path


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="run the daemon on the demo model and clip, with a local broker",
                       description="Start mosquitto on a free port, the daemon on the CPU with the demo "
                                   "model and camera, and print the detections as they arrive.")
    p.add_argument("--seconds", type=float, default=0, help="stop after this many seconds (default: Ctrl-C)")
    p.add_argument("--camera", help="camera URL instead of the demo clip (rtsp://..., a file, /dev/video0)")
    p.add_argument("--model", help="model instead of the demo model (its labels from metadata or --labels)")
    p.add_argument("--labels", help="labels file for --model")
    p.add_argument("--fps", type=float, default=10, help="frames per second to process (default 10)")
    p.add_argument("--status-after", type=float, default=None,
                   help="also print yoloedge-ctl status after N s (it is always printed at the end)")
    p.set_defaults(func=run)


def demo_config(args, workdir: Path, port: int) -> dict:
    # The config file lives in a temp dir and relative paths in it are relative to it.
    model = str(Path(args.model).resolve()) if args.model else str(MODEL)
    camera = args.camera or str(clip_path())
    if "://" not in camera and not camera.startswith("/dev/"):
        camera = str(Path(camera).resolve())
    cam = {"name": "demo", "url": camera, "fps": args.fps}
    if not args.camera:
        cam["loop"] = True
    model_cfg = {"path": model}
    labels = str(Path(args.labels).resolve()) if args.labels else (None if args.model else str(LABELS))
    if labels:
        model_cfg["labels"] = labels
    return {
        "device_id": "demo",
        "model": model_cfg,
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [cam],
        "mqtt": {"host": HOST, "port": port, "topic_prefix": "yoloedge", "stats_interval_s": 10},
        "control": {"socket": str(workdir / "control.sock")},
        "logging": {"level": "warning", "target": "stderr"},
        "shutdown_timeout_s": 5,
    }


class Printer:
    """Subscribes to the demo's topics and prints one line per detection message."""

    def __init__(self, port: int):
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.count = 0
        #: cleared before the status table, so it stays on screen; the daemon's "stopped" still shows
        self.show_detections = True
        self._lock = threading.Lock()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="yoloedge-demo-viewer")
        self.client.on_connect = lambda c, u, f, rc, p: c.subscribe([("yoloedge/demo/#", 1)])
        self.client.on_message = self._on_message
        self.client.connect(HOST, port)
        self.client.loop_start()

    def _on_message(self, client, userdata, message) -> None:
        if not message.payload:
            return
        payload = json.loads(message.payload)
        if message.topic.endswith("/detections"):
            line = detection_line(payload, shutil.get_terminal_size().columns)
            with self._lock:
                self.count += 1
            if not self.show_detections:
                return
        elif message.topic.endswith("/status") or message.topic.endswith("/state"):
            line = f"== {message.topic}: {payload.get('state')}" + (
                f" ({payload['reason']})" if payload.get("reason") else "")
        else:
            return
        print(line, flush=True)

    def stop(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


#: at most this many objects are named on one detection line; the rest are counted ("+4 more")
OBJECTS_PER_LINE = 3


def detection_line(payload: dict, width: int = 120, limit: int = OBJECTS_PER_LINE) -> str:
    """'[demo frame    12  latency 41.5 ms] circle 0.97 [190,122,272,203], ... +4 more': the best-
    scored objects, as many as fit `width` columns (one at least, `limit` at most), boxes as
    x1,y1,x2,y2 in source pixels. A busy frame used to make a line of some 300 characters that
    wrapped, and the bare latency figure had no unit."""
    detections = sorted(payload["detections"], key=lambda d: -d["score"])
    head = f"[{payload['camera']} frame {payload['frame']:>5}  latency {payload['latency_ms']:6.1f} ms]"
    if not detections:
        return printable(f"{head} nothing")
    named = [f"{d['label']} {d['score']:.2f} [{','.join(str(round(v)) for v in d['box'])}]" for d in detections]
    for count in range(min(limit, len(named)), 0, -1):
        more = f" +{len(named) - count} more" if len(named) > count else ""
        line = printable(f"{head} {', '.join(named[:count])}{more}")
        if len(line) <= width:
            break
    return line


def run(args: argparse.Namespace) -> int:
    if not args.model and not MODEL.exists():
        print(f"yoloedge demo: the demo model {MODEL} is missing from this installation", file=sys.stderr)
        return 2
    binary = find_mosquitto()
    if binary is None:
        print(f"yoloedge demo: needs the mosquitto MQTT broker: {INSTALL_HINT} "
              "(scripts/demo.sh installs it when run as root)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="yoloedge-demo-") as tmp:
        return _run_in(Path(tmp), binary, args)


def _run_in(workdir: Path, binary: str, args: argparse.Namespace) -> int:
    port = free_port()
    broker = start_broker(binary, workdir, port)
    config_path = workdir / "yoloedge.yaml"
    config_path.write_text(yaml.safe_dump(demo_config(args, workdir, port), sort_keys=False))
    print(f"demo: broker on {HOST}:{port}; config {config_path}; Ctrl-C to stop", flush=True)
    printer = Printer(port)
    env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
    # Its own session: Ctrl-C goes to the terminal's whole process group, and the daemon must
    # still answer the status request the demo makes before it stops it.
    daemon = subprocess.Popen([sys.executable, "-m", "yoloedge", "run", "-c", str(config_path)], env=env,
                              start_new_session=True)
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *a: stop.set())
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    signal.signal(signal.SIGHUP, lambda *a: stop.set())  # a closed terminal: the daemon stops too
    started = time.monotonic()
    status_shown = False
    try:
        while not stop.is_set() and daemon.poll() is None:
            elapsed = time.monotonic() - started
            if not status_shown and args.status_after is not None and elapsed >= args.status_after:
                status_shown = _print_status(workdir / "control.sock")
            if args.seconds and elapsed >= args.seconds:
                break
            stop.wait(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
        printer.show_detections = False  # no more detection lines: the table below stays on screen
        _print_status(workdir / "control.sock")
        code = _stop_daemon(daemon)
        time.sleep(0.3)  # the daemon's last retained "stopped" on its way to the printer
        printer.stop()
        broker.terminate()
        broker.wait(5)
    print(f"demo: {printer.count} detection messages received; daemon exit code {code}", flush=True)
    return 0 if code == 0 else 1


def _print_status(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    print("demo: $ yoloedge-ctl status", flush=True)
    result = subprocess.run([sys.executable, "-m", "yoloedge.cli.ctl", "--socket", str(socket_path), "status"],
                            capture_output=True, text=True, timeout=30)
    print(result.stdout + result.stderr, flush=True)
    return True


def _stop_daemon(daemon: subprocess.Popen) -> int:
    if daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
    try:
        return daemon.wait(20)
    except subprocess.TimeoutExpired:
        daemon.kill()
        return daemon.wait(5)

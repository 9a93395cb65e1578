#!/usr/bin/python3
"""A loopback RTSP camera for tests: serves an H.264 video file (and optionally a test pattern).

Run with the Debian interpreter, which has GStreamer's Python bindings (`gi`); the project's venv
does not:

    /usr/bin/python3 tests/servers/rtsp_server.py --file street.mp4 [--port 0] [--mount /stream]
                                                  [--loop] [--test-pattern] [--address 127.0.0.1]

Prints `READY <port>` on stdout once clients can connect (port 0 lets the kernel choose), and
exits cleanly on SIGTERM/SIGINT. Tests kill, SIGSTOP/SIGCONT and restart it on the same port to
play a camera that dies, freezes or comes back.

Why the file is not served with `filesrc ! qtdemux ! h264parse ! rtph264pay` directly: such a
pipeline ends at the end of the file and cannot loop. Instead the file's H.264 access units are
read into memory once (no re-encoding, so it costs almost no CPU) and each client's media gets
a feeder thread that pushes them into an `appsrc` at the file's own pace, starting again at the
first frame with `--loop`. Media are not shared, so every client starts at a key frame.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstApp", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstApp, GstRtspServer  # noqa: E402

TEST_PATTERN_LAUNCH = (
    "( videotestsrc is-live=true pattern=ball ! video/x-raw,width=320,height=240,framerate=15/1 "
    "! x264enc tune=zerolatency speed-preset=ultrafast key-int-max=15 bitrate=300 "
    "! video/x-h264,profile=baseline ! rtph264pay name=pay0 pt=96 config-interval=1 )"
)
FEEDER_LAUNCH = "( appsrc name=src is-live=true format=time ! h264parse ! rtph264pay name=pay0 pt=96 config-interval=1 )"


@dataclass(frozen=True)
class AccessUnit:
    """One H.264 access unit of the file, with its timestamps relative to the file's start."""

    data: bytes
    pts: int
    dts: int
    duration: int
    delta: bool  # not a key frame


@dataclass(frozen=True)
class H264Clip:
    caps: Gst.Caps
    units: tuple[AccessUnit, ...]
    duration: int  # ns: the offset added to timestamps on every loop


def load_h264(path: str) -> H264Clip:
    """Demux and parse the file once; the feeders replay these access units without decoding."""
    pipeline = Gst.parse_launch(
        "filesrc name=file ! parsebin ! h264parse "
        "! video/x-h264,stream-format=byte-stream,alignment=au ! appsink name=sink sync=false"
    )
    pipeline.get_by_name("file").set_property("location", path)
    sink = pipeline.get_by_name("sink")
    pipeline.set_state(Gst.State.PLAYING)
    units: list[AccessUnit] = []
    caps = None
    try:
        while True:
            sample = sink.try_pull_sample(10 * Gst.SECOND)
            if sample is None:
                break
            caps = caps or sample.get_caps()
            buf = sample.get_buffer()
            ok, info = buf.map(Gst.MapFlags.READ)
            if not ok:
                raise RuntimeError("cannot map buffer")
            data = bytes(info.data)
            buf.unmap(info)
            dts = buf.dts if buf.dts != Gst.CLOCK_TIME_NONE else buf.pts
            units.append(AccessUnit(data, buf.pts, dts, buf.duration, buf.has_flags(Gst.BufferFlags.DELTA_UNIT)))
    finally:
        pipeline.set_state(Gst.State.NULL)
    if not units or caps is None:
        raise SystemExit(f"no H.264 video found in {path}")
    last = units[-1]
    end = max(u.pts for u in units) + (last.duration if last.duration != Gst.CLOCK_TIME_NONE else 0)
    first_dts = min(u.dts for u in units)
    return H264Clip(caps, tuple(units), end - min(first_dts, 0))


class Feeder:
    """Pushes a clip into one media's appsrc at real-time pace until the media goes away."""

    def __init__(self, clip: H264Clip, appsrc: GstApp.AppSrc, loop: bool):
        self._clip = clip
        self._appsrc = appsrc
        self._loop = loop
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        start = time.monotonic()
        # Decode timestamps can start below zero (B-frame reordering); shift them so they don't.
        shift = -min(0, min(u.dts for u in self._clip.units))
        offset = 0
        while not self._stopped.is_set():
            for unit in self._clip.units:
                due = start + (unit.dts + shift + offset) / Gst.SECOND
                if self._stopped.wait(max(0.0, due - time.monotonic())):
                    return
                if self._push(unit, offset + shift) != Gst.FlowReturn.OK:
                    return  # the media was torn down (client left)
            if not self._loop:
                self._appsrc.end_of_stream()
                return
            offset += self._clip.duration

    def _push(self, unit: AccessUnit, offset: int) -> Gst.FlowReturn:
        buf = Gst.Buffer.new_wrapped(unit.data)
        buf.pts = unit.pts + offset
        buf.dts = unit.dts + offset
        buf.duration = unit.duration
        if unit.delta:
            buf.set_flags(Gst.BufferFlags.DELTA_UNIT)
        return self._appsrc.push_buffer(buf)


def add_file_mount(mounts: GstRtspServer.RTSPMountPoints, mount: str, clip: H264Clip, loop: bool) -> None:
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(FEEDER_LAUNCH)
    factory.set_shared(False)

    def on_media_configure(_factory, media):
        appsrc = media.get_element().get_by_name("src")
        appsrc.set_property("caps", clip.caps)
        feeder = Feeder(clip, appsrc, loop)
        media.connect("unprepared", lambda *_: feeder.stop())
        feeder.start()

    factory.connect("media-configure", on_media_configure)
    mounts.add_factory(mount, factory)


def add_test_pattern_mount(mounts: GstRtspServer.RTSPMountPoints) -> None:
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(TEST_PATTERN_LAUNCH)
    factory.set_shared(True)
    mounts.add_factory("/test", factory)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--file", help="H.264 video file (mp4/mkv/...) to serve")
    parser.add_argument("--port", default="0", help="TCP port; 0 lets the kernel choose")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--mount", default="/stream", help="path of the file stream")
    parser.add_argument("--loop", action="store_true", help="start the file again at its end")
    parser.add_argument("--test-pattern", action="store_true", help="also serve a live test pattern at /test")
    args = parser.parse_args(argv)
    if not args.file and not args.test_pattern:
        parser.error("nothing to serve: give --file and/or --test-pattern")
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(args.address)
    server.set_service(str(args.port))
    mounts = server.get_mount_points()
    if args.file:
        add_file_mount(mounts, args.mount, load_h264(os.path.abspath(args.file)), args.loop)
    if args.test_pattern:
        add_test_pattern_mount(mounts)
    if server.attach(None) == 0:
        print(f"cannot listen on {args.address}:{args.port}", file=sys.stderr, flush=True)
        return 1
    loop = GLib.MainLoop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, signum, lambda *_: loop.quit() or GLib.SOURCE_REMOVE)
    print("READY", server.get_bound_port(), flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

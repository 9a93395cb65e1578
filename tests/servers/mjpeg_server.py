"""A loopback MJPEG camera for tests: multipart/x-mixed-replace JPEG frames of a video file over HTTP.

Use it in-process (`MjpegServer(video, fps).start()`, as the `mjpeg_server` fixture does) or as a
process (so tests can kill or SIGSTOP it):

    python tests/servers/mjpeg_server.py VIDEO [--fps 15] [--port 0] [--max-frames 120]

prints `READY <port>`; the stream is at http://127.0.0.1:PORT/stream.mjpg (any path works).

Frames are decoded and JPEG-encoded once at start, so serving costs almost no CPU and every
client gets the same pictures, looping forever at `fps`. `freeze()` keeps connections open but
sends nothing (a hung camera); `stop()` closes everything (a dead camera).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2

BOUNDARY = "frame"


def encode_video(video: Path | str, max_frames: int, quality: int = 80) -> list[bytes]:
    """The first `max_frames` frames of `video` as JPEG bytes."""
    cap = cv2.VideoCapture(str(video))
    frames: list[bytes] = []
    try:
        while len(frames) < max_frames:
            ok, image = cap.read()
            if not ok:
                break
            ok, jpg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
            if ok:
                frames.append(jpg.tobytes())
    finally:
        cap.release()
    if not frames:
        raise ValueError(f"no frame could be read from {video}")
    return frames


class MjpegServer:
    """Serves `frames` (JPEG bytes) in a loop at `fps` to every client, on 127.0.0.1:`port`."""

    def __init__(self, frames: list[bytes], fps: float = 15.0, port: int = 0, host: str = "127.0.0.1"):
        self.frames = frames
        self.fps = fps
        self.host = host
        self._requested_port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._running = threading.Event()  # cleared by freeze()
        self._running.set()
        self.port = 0

    @classmethod
    def from_video(cls, video: Path | str, fps: float = 15.0, port: int = 0, max_frames: int = 120) -> "MjpegServer":
        return cls(encode_video(video, max_frames), fps, port)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/stream.mjpg"

    def start(self) -> "MjpegServer":
        self._closing.clear()
        self._httpd = ThreadingHTTPServer((self.host, self._requested_port or self.port), self._handler_class())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="mjpeg-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listening socket and every client connection (clients see the stream end)."""
        self._closing.set()
        self._running.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def restart(self) -> None:
        """Listen again on the same port."""
        self.stop()
        self.start()

    def freeze(self) -> None:
        """Stop sending frames but keep every connection open, as a hung camera does."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                self.send_response(200)
                self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                try:
                    server._stream(self.wfile)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away: normal for a camera stream

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass  # keep test output quiet

        return Handler

    def _stream(self, wfile) -> None:
        period = 1.0 / self.fps
        next_due = time.monotonic()
        index = 0
        while not self._closing.is_set():
            self._running.wait()
            if self._closing.is_set():
                return
            jpg = self.frames[index % len(self.frames)]
            wfile.write(f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: {len(jpg)}\r\n\r\n".encode()
                        + jpg + b"\r\n")
            wfile.flush()
            index += 1
            next_due = max(next_due + period, time.monotonic() - period)
            time.sleep(max(0.0, next_due - time.monotonic()))

    def __enter__(self) -> "MjpegServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Serve a video file as an MJPEG HTTP camera.")
    parser.add_argument("video")
    parser.add_argument("--fps", type=float, default=15.0)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-frames", type=int, default=120)
    args = parser.parse_args(argv)
    server = MjpegServer.from_video(args.video, args.fps, args.port, args.max_frames).start()
    print("READY", server.port, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

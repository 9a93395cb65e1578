"""`{"cmd": "watch"}`: the detection messages of one camera (or all), streamed as they go out.

After the reply `{"ok": true, "watching": CAMERA | null}` the connection carries one line per
published detection message, `{"event": "detections", "message": {...}}` (the MQTT payload as
is), until the client disconnects. `{"cmd": "watch", "events": true}` streams the camera's event
messages instead (new, update, end: `WatchHub.publish_event`, fed by the router), one
`{"event": "events", "message": {...}}` line each; its reply says `"events": true`.

A watcher that reads too slowly loses the oldest lines, not
the pipeline's time: each `Subscription` holds at most `MAX_QUEUED_LINES`, drops the oldest when
full and counts the drops; the next line it sends is then `{"event": "dropped", "total": N}`.

Publishing (a post-processing thread) only appends to those queues under their own small locks,
and pokes the control server's I/O thread when a queue was empty; the I/O thread moves lines to
the sockets without blocking (see `control.server`). With nobody watching, publishing costs a
tuple check.
"""

from __future__ import annotations

import collections
import threading
from enum import Enum
from typing import Callable

from .protocol import encode, quoted_name
from .server import Stream, StreamOpener, unexpected_fields

#: lines one watcher may have waiting; the oldest go first when it cannot keep up.
MAX_QUEUED_LINES = 256
#: watchers at once (each holds a connection and a queue).
MAX_WATCHERS = 8


class Channel(str, Enum):
    """What a watcher is sent: the per-frame detection messages, or the event messages."""
    DETECTIONS = "detections"
    EVENTS = "events"


class Subscription:
    """One watcher's queue, between the publishing threads and the control I/O thread."""

    def __init__(self, hub: WatchHub, camera: str | None, wake: Callable[[], None], max_lines: int,
                 channel: Channel = Channel.DETECTIONS):
        self.hub = hub
        self.camera = camera  # None: every camera
        self.channel = channel
        self._wake = wake
        self._lock = threading.Lock()
        self._lines: collections.deque[bytes] = collections.deque(maxlen=max_lines)
        self.dropped = 0
        self._reported = 0

    def push(self, line: bytes) -> None:
        with self._lock:
            if len(self._lines) == self._lines.maxlen:
                self.dropped += 1  # the deque drops the oldest itself
            was_empty = not self._lines
            self._lines.append(line)
        if was_empty:
            self._wake()

    def take(self, max_bytes: int) -> bytes:
        """I/O thread: the queued lines, oldest first, up to about `max_bytes` (at least one)."""
        out: list[bytes] = []
        size = 0
        with self._lock:
            if self.dropped != self._reported:
                self._reported = self.dropped
                out.append(encode({"event": "dropped", "total": self.dropped}))
            while self._lines and (size < max_bytes or not out):
                line = self._lines.popleft()
                out.append(line)
                size += len(line)
        return b"".join(out)

    def queued(self) -> int:
        with self._lock:
            return len(self._lines)

    def close(self) -> None:
        self.hub.remove(self)


class WatchHub:
    def __init__(self, max_watchers: int = MAX_WATCHERS, max_lines: int = MAX_QUEUED_LINES):
        self.max_watchers = max_watchers
        self.max_lines = max_lines
        self._lock = threading.Lock()
        self._subs: tuple[Subscription, ...] = ()  # replaced whole: publishers read it unlocked

    def subscribe(self, camera: str | None, wake: Callable[[], None],
                  channel: Channel = Channel.DETECTIONS) -> Subscription | None:
        """None when `max_watchers` already watch (both channels together)."""
        with self._lock:
            if len(self._subs) >= self.max_watchers:
                return None
            sub = Subscription(self, camera, wake, self.max_lines, channel)
            self._subs = (*self._subs, sub)
            return sub

    def remove(self, sub: Subscription) -> None:
        with self._lock:
            self._subs = tuple(s for s in self._subs if s is not sub)

    @property
    def watched(self) -> bool:
        """Someone watches: without watchers, no message needs to be built for them."""
        return bool(self._subs)

    def publish(self, camera: str, message: dict) -> None:
        """A detection message went out for `camera`: queue it for its watchers (encoded once)."""
        self._fan_out(Channel.DETECTIONS, camera, message)

    def publish_event(self, camera: str, message: dict) -> None:
        """An event message (new, update, end) went out for `camera`: the same for event watchers."""
        self._fan_out(Channel.EVENTS, camera, message)

    def _fan_out(self, channel: Channel, camera: str, message: dict) -> None:
        subs = self._subs
        if not subs:
            return
        line = None
        for sub in subs:
            if sub.channel is channel and (sub.camera is None or sub.camera == camera):
                if line is None:
                    line = encode({"event": channel.value, "message": message})
                sub.push(line)

    def stats(self) -> list[dict]:
        return [{"camera": s.camera, "channel": s.channel.value, "queued": s.queued(), "dropped": s.dropped}
                for s in self._subs]

    def opener(self, known: Callable[[str], bool]) -> StreamOpener:
        """The control server's stream opener for `watch` (see `ControlServer(streams=...)`):
        `known(name)` says whether a camera of that name is configured."""
        def open_watch(request: dict, wake: Callable[[], None]) -> tuple[dict, Stream | None]:
            refused = unexpected_fields(request, takes=("camera", "events"))
            if refused is not None:
                return refused, None
            camera, events = request.get("camera"), request.get("events", False)
            if camera is not None and not isinstance(camera, str):
                return {"ok": False, "error": '"camera" must be a camera name or null'}, None
            if not isinstance(events, bool):
                return {"ok": False, "error": '"events" must be true or false'}, None
            if camera is not None and not known(camera):
                return {"ok": False, "reason": "unknown_camera",
                        "error": f"no camera named {quoted_name(camera)}"}, None
            sub = self.subscribe(camera, wake, Channel.EVENTS if events else Channel.DETECTIONS)
            if sub is None:
                return {"ok": False, "error": f"{self.max_watchers} watchers already; try again later"}, None
            return ({"ok": True, "watching": camera, "events": True} if events
                    else {"ok": True, "watching": camera}), sub
        return open_watch

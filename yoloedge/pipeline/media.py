"""The Atlas cards' media engines of one accelerator group, as its cameras see them (`decoder: dvpp`).

    reader thread: demux -> VdecChannel.send --(card decodes)--> report thread: on_picture
                -> the camera's picture queue -> DvppSource.grab -> Frame.picture -> queues
    preparer: CardPicture.letterbox_into (VPC on the card, into the model input slot) -> release

A camera the card decodes is pinned to one device of its group: the device with the fewest such
cameras when it is added (its decoder channel, picture ring and model input slots must all be in
that card's memory). Each card's `DvppCard` (backends.dvpp: its context, DVPP channel, report
thread) is opened when its first camera comes and closed with the group; a camera's decoder channel
is opened at its first connection, kept across reconnects (the same codec and size reuse it), and
closed when the camera is removed.

Locks: `_lock` guards the cards and the cameras' assignments (a leaf: the card's own calls run
outside it); each channel's `_ready` condition guards its picture queue, and is taken by the
report thread (on_picture) and the camera's reader only.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import cv2
import numpy as np

from ..config.schema import AcceleratorConfig
from ..errors import YoloedgeError
from ..metrics import RateMeter
from ..preprocess import Geometry
from ..sources.base import SourceError

if TYPE_CHECKING:
    from ..sources.demux import StreamInfo

log = logging.getLogger(__name__)

#: decoded pictures a camera's ring holds beyond its queue: a few in the decoder and with the
#: reader, one being letterboxed by each of the preparers (up to `prepare.MAX_AUTO_THREADS`)
RING_SLACK = 8
#: how long a reader waits for a free picture before the access unit is dropped: a live camera
#: drops soon (the card is behind, and newer frames come), a lossless one waits for the pipeline
LIVE_WAIT_S = 1.0
LOSSLESS_WAIT_S = 30.0
#: how long VDEC may take to give back an input buffer (its decode ends) once a picture is free
INPUT_WAIT_S = 2.0
#: how often a reader whose ring is full looks again (a picture given back wakes no one here)
SEND_POLL_S = 0.02


class MediaError(YoloedgeError):
    """A camera cannot be decoded on its card (the reason is safe to log)."""


class CardPicture:
    """A decoded picture in a card's DVPP memory, shared by the holders of its frame (see
    `sources.frame.DevicePicture`): the last `release` gives it back to its channel's ring."""

    __slots__ = ("_inner", "_card", "device", "width", "height", "pts_s", "_holders", "_lock")

    def __init__(self, inner: Any, card: Any, device: str):
        self._inner = inner
        self._card = card
        self.device = device
        self.width = int(inner.width)
        self.height = int(inner.height)
        self.pts_s: float | None = inner.pts
        self._holders = 1
        self._lock = threading.Lock()

    def hold(self) -> None:
        with self._lock:
            self._holders += 1

    def release(self) -> None:
        with self._lock:
            self._holders -= 1
            last = self._holders == 0
        if last:
            self._inner.release()

    def letterbox_into(self, address: int, width: int, height: int) -> Geometry:
        geometry: Geometry = self._card.letterbox(self._inner, address, width, height)
        return geometry

    def to_bgr(self) -> np.ndarray:
        """Copied back from the card (only for whoever keeps the frame: snapshots, best shots)."""
        return cv2.cvtColor(self._card.to_host(self._inner), cv2.COLOR_YUV2BGR_NV12)


class _Channel:
    """One camera's decoder channel, as `sources.dvpp.VideoDecoder`."""

    def __init__(self, camera: str, device: str, card: Any, info: StreamInfo, ring: int, wait_s: float):
        self.camera = camera
        self.device = device
        self.key = (info.codec, info.width, info.height)
        self._card = card
        self._ready = threading.Condition()
        self._pictures: collections.deque[CardPicture] = collections.deque()
        self._error: str | None = None
        self.rate = RateMeter()  # pictures decoded a second, for the card's budget in status
        self._wait_s = wait_s
        self._vdec = card.open_vdec(camera, info.codec, info.width, info.height, ring, self._on_picture,
                                    on_error=self._on_error, profile=info.profile, wait_s=INPUT_WAIT_S)

    def _on_picture(self, picture: Any) -> None:
        """The report thread: a picture came out of the decoder."""
        with self._ready:
            self._pictures.append(CardPicture(picture, self._card, self.device))
            self._ready.notify_all()
        self.rate.mark()

    def _on_error(self, code: int) -> None:
        """The report thread: VDEC could not decode a frame (its picture went back to the ring)."""
        with self._ready:
            self._error = f"the card's VDEC could not decode a frame (picture ret code {code})"
            self._ready.notify_all()

    @property
    def stats(self) -> Any:
        return self._vdec.stats

    def send(self, data: bytes, pts_s: float | None) -> bool:
        """Decode one access unit once the ring has a free picture. False, without sending, while
        decoded pictures wait to be taken and the ring has none free: the reader takes them
        first (it is the one that frees them), then offers the unit again. A ring that stays full
        for the channel's wait (everything downstream) drops the unit, counted in its stats."""
        deadline = time.monotonic() + self._wait_s
        while self._vdec.free_pictures == 0 and time.monotonic() < deadline:
            with self._ready:
                if self._pictures:
                    return False
                self._ready.wait(SEND_POLL_S)
        try:
            self._vdec.send(data, pts_s or 0.0)
        except YoloedgeError as exc:
            raise SourceError(f"the card refused an access unit: {exc}") from exc
        return True

    def next_picture(self, timeout_s: float) -> CardPicture | None:
        with self._ready:
            if not self._pictures and timeout_s > 0:
                self._ready.wait_for(lambda: bool(self._pictures), timeout_s)
            return self._pictures.popleft() if self._pictures else None

    def flush(self, timeout_s: float) -> None:
        if not self._vdec.flush(timeout_s):
            log.warning("camera %s: the card's decoder did not return every frame within %.1f s of the stream's "
                        "end", self.camera, timeout_s, extra={"camera": self.camera})

    @property
    def error(self) -> str | None:
        return self._error

    def close(self) -> None:
        """Give back the pictures nobody took, then close the channel on the card."""
        with self._ready:
            waiting, self._pictures = list(self._pictures), collections.deque()
        for picture in waiting:
            picture.release()
        self._vdec.close()


@dataclass
class _Camera:
    device_index: int
    channel: _Channel | None = None


class CameraMedia:
    """A camera's way onto its card (`sources.dvpp.MediaEngine`)."""

    def __init__(self, owner: GroupMedia, camera: str, device_index: int, ring: int, wait_s: float):
        self._owner = owner
        self.camera = camera
        self.device_index = device_index
        self._ring = ring
        self._wait_s = wait_s

    @property
    def device(self) -> str:
        return self._owner.worker_name(self.device_index)

    def unsupported(self, info: StreamInfo) -> str | None:
        from ..backends.dvpp_limits import dvpp_unsupported
        soc = self._owner.soc(self.device_index)
        reason: str | None = dvpp_unsupported(info.codec, info.profile, info.pix_fmt, info.width or None,
                                              info.height or None, soc)
        return reason

    def video_decoder(self, info: StreamInfo) -> _Channel:
        return self._owner.channel(self.camera, info, self._ring, self._wait_s)


class GroupMedia:
    """The media engines of one Ascend group's cards (module docstring)."""

    def __init__(self, group: str, config: AcceleratorConfig):
        self.group = group
        self.config = config
        self._lock = threading.Lock()
        self._cards: dict[int, Any] = {}  # device index -> open DvppCard
        self._cameras: dict[str, _Camera] = {}

    def worker_name(self, index: int) -> str:
        return f"{self.group}/{self.config.devices[index]}"

    def for_camera(self, camera: str, queue_size: int = 2, lossless: bool = False) -> CameraMedia:
        """Pin `camera` to the card with the fewest cameras, opening that card's engine if needed.
        Its ring holds what its queue and the preparers may hold at once; a lossless camera's
        reader waits for a free picture as long as the pipeline may take to free one, a live
        camera's drops the frame after a moment (the card is behind)."""
        with self._lock:
            entry = self._cameras.get(camera)
            if entry is None:
                load = collections.Counter(c.device_index for c in self._cameras.values())
                index = min(range(len(self.config.devices)), key=lambda i: (load[i], i))
                entry = self._cameras[camera] = _Camera(index)
            index = entry.device_index
        try:
            self._card(index)
        except Exception:
            with self._lock:
                self._cameras.pop(camera, None)
            raise
        return CameraMedia(self, camera, index, queue_size + RING_SLACK,
                           LOSSLESS_WAIT_S if lossless else LIVE_WAIT_S)

    def soc(self, index: int) -> str | None:
        with self._lock:
            card = self._cards.get(index)
        return None if card is None else card.soc

    def _card(self, index: int) -> Any:
        with self._lock:
            card = self._cards.get(index)
        if card is not None:
            return card
        from ..backends.dvpp import DvppCard  # pyACL, on first use
        card = DvppCard(self.config.devices[index])
        try:
            card.open()
        except YoloedgeError as exc:
            raise MediaError(f"the media engine of {self.worker_name(index)} did not open: {exc}") from exc
        with self._lock:
            self._cards[index] = card
        log.info("%s: the card's media engine (DVPP) is open", self.worker_name(index))
        return card

    def channel(self, camera: str, info: StreamInfo, ring: int, wait_s: float) -> _Channel:
        """The camera's decoder channel for this stream: the open one again when codec and size
        are the same (a reconnect), else a new one in place of the old."""
        with self._lock:
            entry = self._cameras.get(camera)
            if entry is None:
                raise MediaError(f"camera {camera} is not on a card (removed?)")
            card = self._cards[entry.device_index]
            old = entry.channel
        key = (info.codec, info.width, info.height)
        if old is not None and old.key == key:
            return old
        if old is not None:
            log.info("camera %s: the stream changed to %s %dx%d; its decoder channel is made again",
                     camera, *key, extra={"camera": camera})
            old.close()
        try:
            channel = _Channel(camera, self.worker_name(entry.device_index), card, info, ring, wait_s)
        except YoloedgeError as exc:
            raise SourceError(f"the card cannot open a decoder channel: {exc}") from exc
        with self._lock:
            entry.channel = channel
        return channel

    def remove_camera(self, camera: str) -> None:
        with self._lock:
            entry = self._cameras.pop(camera, None)
        if entry is not None and entry.channel is not None:
            entry.channel.close()

    def status(self) -> dict[str, dict]:
        """Per device: cameras on it and the card's own figures (channels, decoded frames)."""
        with self._lock:
            cards = dict(self._cards)
            cameras = collections.Counter(c.device_index for c in self._cameras.values())
            channels = {i: [c.channel for c in self._cameras.values() if c.device_index == i and c.channel]
                        for i in cards}
        from ..backends.dvpp_limits import limits_for
        out = {}
        for i, card in cards.items():
            limits = limits_for(card.soc)
            stats = [ch.stats for ch in channels[i] if ch is not None]
            fps = sum(ch.rate.rate() for ch in channels[i] if ch is not None)
            out[self.worker_name(i)] = {
                "soc": card.soc, "cameras": cameras[i], "vdec_channels": len(stats),
                "vdec_channel_limit": limits.vdec_channels, "decode_budget_fps_1080p": limits.vdec_fps_1080p,
                "decode_fps": round(fps, 1), "decoded": sum(s.decoded for s in stats),
                "decode_errors": sum(s.errors for s in stats),
                "dropped": sum(s.dropped for s in stats)}
        return out

    def close(self) -> None:
        """Every channel, then every card (idempotent)."""
        with self._lock:
            entries, self._cameras = list(self._cameras.values()), {}
            cards, self._cards = list(self._cards.values()), {}
        for entry in entries:
            if entry.channel is not None:
                try:
                    entry.channel.close()
                except YoloedgeError as exc:
                    log.error("closing the decoder channel of camera %s failed: %s", entry.channel.camera, exc)
        for card in cards:
            card.close()

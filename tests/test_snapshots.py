"""Annotated snapshots and live watching: `yoloedge-ctl snapshot` / `watch` against the real
daemon (mosquitto, the shared model and video), plus the snapshot store and the control
server's streams in-process, where a stuck watcher and allocations can be measured."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import cv2
import numpy as np
import pytest

from daemon_harness import REPO, ctl, status
import test_daemon
from test_daemon import base_config, detections_by_frame
from yoloedge.control.client import request
from yoloedge.control.server import ControlServer
from yoloedge.control.watch import WatchHub
from yoloedge.pipeline.snapshots import Snapshot, SnapshotMiss, SnapshotStore
from yoloedge.postprocess import Detections
from yoloedge.sources.frame import Frame

notify, start_daemon = test_daemon.notify, test_daemon.start_daemon  # the daemon tests' fixtures
VIDEO = "indoor_people_480p_mpeg4.avi"
FRAMES = 84
EXIT_NO_SUCH_CAMERA, EXIT_NO_FRAME_YET = 5, 6


def video_frame(path: Path, index: int) -> np.ndarray:
    cap = cv2.VideoCapture(str(path))
    try:
        for _ in range(index + 1):
            ok, image = cap.read()
            assert ok, f"{path} has no frame {index}"
        return image
    finally:
        cap.release()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str) -> tuple[int, str, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type") or "", response.read()
    finally:
        conn.close()


def edge_pixels(box: list[float], width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the four sides of `box` (clipped to the image)."""
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    x1, x2 = max(0, x1), min(width - 1, x2)
    y1, y2 = max(0, y1), min(height - 1, y2)
    xs = np.arange(x1, x2 + 1)
    ys = np.arange(y1, y2 + 1)
    rows = np.concatenate([np.full(len(xs), y1), np.full(len(xs), y2), ys, ys])
    cols = np.concatenate([xs, xs, np.full(len(ys), x1), np.full(len(ys), x2)])
    return rows, cols


def clear_patch(boxes: list[list[float]], width: int, height: int, size: int = 48,
                margin: int = 40) -> tuple[int, int] | None:
    """Top-left of a size x size patch at least `margin` px from every box (labels sit above boxes)."""
    for y in range(0, height - size, 8):
        for x in range(0, width - size, 8):
            if all(x + size + margin < b[0] or x > b[2] + margin or y + size + margin < b[1] or y > b[3] + margin
                   for b in boxes):
                return x, y
    return None


# -- the real daemon ---------------------------------------------------------------------------
@pytest.mark.shared
def test_ctl_snapshot_draws_the_published_boxes_on_the_source_frame(tmp_path, models, media, mosquitto,
                                                                     subscriber, notify, start_daemon):
    video = media / VIDEO
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(video), "realtime": False},
        {"name": "later", "url": "rtsp://127.0.0.1:9/nothing"},  # never delivers a frame
    ])
    port = free_port()
    config["http"] = {"listen": f"127.0.0.1:{port}"}
    daemon, _ = start_daemon(config)
    sock = config["control"]["socket"]
    notify.wait_for("READY", "1", timeout=60)
    assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "door")) >= FRAMES, 90), daemon.log

    out = tmp_path / "door.jpg"
    result = ctl(sock, "snapshot", "door", "-o", str(out))
    assert result.returncode == 0, result.stderr
    frame = int(re.search(r"frame (\d+)", result.stdout).group(1))
    assert 0 <= frame < FRAMES
    published = detections_by_frame(subscriber, "door")[frame][0]["detections"]
    assert published, f"frame {frame} has no detections to look for"

    shot = cv2.imread(str(out))
    assert shot is not None and shot.shape == (480, 640, 3)
    source = video_frame(video, frame).astype(np.int16)
    diff = np.abs(shot.astype(np.int16) - source).max(axis=2)
    for det in published:
        rows, cols = edge_pixels(det["box"], 640, 480)
        assert diff[rows, cols].mean() > 40, f"no box drawn at {det}"
    patch = clear_patch([d["box"] for d in published], 640, 480)
    assert patch is not None
    x, y = patch
    assert diff[y:y + 48, x:x + 48].mean() < 6, "pixels away from every box changed (beyond JPEG loss)"

    # The HTTP endpoint serves the same annotated frame, 404 for no such camera, 503 before a frame.
    body = http_get(port, "/api/cameras/door/latest.jpg")
    assert body[0] == 200 and body[1] == "image/jpeg"
    served = cv2.imdecode(np.frombuffer(body[2], np.uint8), cv2.IMREAD_COLOR)
    assert served is not None and np.array_equal(served, shot)
    assert http_get(port, "/api/cameras/nosuch/latest.jpg")[0] == 404
    assert http_get(port, "/api/cameras/later/latest.jpg")[0] == 503

    missing = ctl(sock, "snapshot", "nosuch", "-o", str(tmp_path / "x.jpg"))
    assert missing.returncode == EXIT_NO_SUCH_CAMERA and "no camera named 'nosuch'" in missing.stderr
    waiting = ctl(sock, "snapshot", "later", "-o", str(tmp_path / "y.jpg"))
    assert waiting.returncode == EXIT_NO_FRAME_YET and "no processed frame yet" in waiting.stderr
    assert not (tmp_path / "x.jpg").exists() and not (tmp_path / "y.jpg").exists()
    watch_missing = ctl(sock, "watch", "nosuch")
    assert watch_missing.returncode == EXIT_NO_SUCH_CAMERA, watch_missing.stderr
    assert daemon.stop() == 0


class LineReader:
    """A subprocess's stdout, collected on a thread so the test never blocks on it."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait(self, count: int, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.lines) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return list(self.lines)


def start_watch(sock: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "yoloedge.cli.ctl", "--socket", sock, "watch", *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


#: generous: each wait ends as soon as its condition holds. Under CPU load the daemon here ran at
#: about 1 frame/s, and the stuck watcher's socket takes some 60 lines to fill (each ~360-byte
#: line is one ~1 KiB buffer in the kernel's accounting, against STREAM_SNDBUF_BYTES doubled).
WATCH_DEADLINE_S = 300


def watchers_of(sock: str, camera: str | None) -> list[dict]:
    return [w for w in status(sock).get("watchers", []) if w["camera"] == camera]


@pytest.mark.shared
def test_ctl_watch_streams_the_mqtt_messages_and_a_stuck_watcher_stalls_nothing(
        tmp_path, models, media, mosquitto, subscriber, notify, start_daemon):
    config = base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(media / VIDEO), "realtime": False, "loop": True},
    ])
    daemon, _ = start_daemon(config)
    sock = config["control"]["socket"]
    notify.wait_for("READY", "1", timeout=60)
    watchers: list[subprocess.Popen] = []
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        raw = start_watch(sock, "door", "--json")
        human = start_watch(sock)
        watchers += [raw, human]
        raw_lines = LineReader(raw).wait(20, WATCH_DEADLINE_S)
        human_reader = LineReader(human)
        human_lines = human_reader.wait(3, WATCH_DEADLINE_S)
        assert len(raw_lines) >= 20, daemon.log
        messages = [json.loads(line) for line in raw_lines]
        frames = [m["frame"] for m in messages]
        assert frames == sorted(frames) and len(set(frames)) == len(frames)
        assert subscriber.wait_for(lambda ms: set(frames) <= set(detections_by_frame(subscriber, "door")),
                                   WATCH_DEADLINE_S)
        by_frame = detections_by_frame(subscriber, "door")
        for message in messages:
            assert message == by_frame[message["frame"]][0], "watch line differs from the MQTT message"
        line = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \[door frame +(\d+)  latency +[\d.]+ ms\] ")
        assert len(human_lines) >= 3 and all(line.match(text) for text in human_lines[:3]), human_lines
        assert all(len(text) < 160 for text in human_lines[:3])

        # The raw watcher leaves, so that the only watcher of "door" is the stuck one below: the
        # status of a watcher that reads can show a line queued for a moment, which is not what
        # this waits for (it once ended the wait early, and the check after it then saw 0).
        raw.terminate()
        raw.wait(10)
        deadline = time.monotonic() + WATCH_DEADLINE_S
        while watchers_of(sock, "door") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert watchers_of(sock, "door") == [], "the daemon still counts a watcher that left"

        # A watcher that never reads: its lines are dropped for it; status, publishing and the
        # watcher that reads go on.
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(sock)
        stuck.sendall(b'{"cmd": "watch", "camera": "door"}\n')
        backlog = 0  # lines the daemon holds for it (queued + dropped): its socket is full
        while not backlog and time.monotonic() < deadline:
            time.sleep(0.5)
            backlog = sum(w["queued"] + w["dropped"] for w in watchers_of(sock, "door"))
        assert backlog > 0, "the stuck watcher's socket never filled"
        published = len(detections_by_frame(subscriber, "door"))
        shown = len(human_reader.lines)
        answered = ctl(sock, "status", "--json")
        assert answered.returncode in (0, 1), answered.stderr
        assert json.loads(answered.stdout)["daemon"]["state"] == "running"
        assert subscriber.wait_for(lambda ms: len(detections_by_frame(subscriber, "door")) >= published + 20,
                                   WATCH_DEADLINE_S), "frames stopped being published behind a stuck watcher"
        assert len(human_reader.wait(shown + 20, WATCH_DEADLINE_S)) >= shown + 20, \
            "the watcher that reads stopped getting lines behind a stuck one"
    finally:
        stuck.close()
        for proc in watchers:
            proc.terminate()
            proc.wait(10)
    assert daemon.stop() == 0


# -- in-process: the store and the control server's streams --------------------------------------
def _frame(image: np.ndarray, seq: int) -> Frame:
    return Frame("cam", seq, image, capture_time=1000.0 + seq, capture_mono=float(seq))


def test_snapshot_store_copies_at_a_bounded_rate_and_allocates_nothing_per_frame():
    now = [0.0]
    store = SnapshotStore(copies_per_s=2.0, clock=lambda: now[0], watch_s=float("inf"))
    store.add("cam")
    assert store.latest("cam") is SnapshotMiss.NO_FRAME_YET and store.latest_jpeg("cam") is None
    assert store.latest("other") is SnapshotMiss.UNKNOWN_CAMERA and not store.known("other")
    image = np.zeros((720, 1280, 3), np.uint8)
    dets = Detections(np.array([[10, 20, 200, 300]], np.float32), np.array([0.9], np.float32),
                      np.array([0], np.int32), 1280, 720)
    frames = [_frame(image, seq) for seq in range(600)]  # made before measuring
    shown = []

    def run(batch: list[Frame]) -> None:
        for frame in batch:
            now[0] += 0.125  # 8 frames/s (exact in binary: no drift in the count below)
            store.offer(frame)
            store.published("cam", frame.seq, frame.capture_mono, frame.capture_time, dets, ("person",))
            shown.append(store._cameras["cam"].seq)

    run(frames[:100])  # both buffers exist after the first two copies
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    run(frames[100:])
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename")
                if s.traceback[0].filename.endswith("pipeline/snapshots.py") and s.size_diff > 0)
    assert grown < 4096, f"the store grew by {grown} bytes over 500 frames (one frame copy is {image.nbytes})"
    assert store.allocations("cam") == 2
    updates = len(set(shown))
    assert updates == 150, f"{updates} snapshots in 75 s at 2 copies/s"

    # Only the frame that was copied becomes the snapshot: not another one published meanwhile,
    # nor one with the same number from an earlier connection (its capture time differs).
    last = shown[-1]
    now[0] += 1
    store.offer(_frame(image, 10_000))
    store.published("cam", 10_001, 10_001.0, 0.0, dets, ("person",))
    store.published("cam", 10_000, 5.0, 0.0, dets, ("person",))
    assert store._cameras["cam"].seq == last
    store.published("cam", 10_000, 10_000.0, 0.0, dets, ("person",))
    assert store._cameras["cam"].seq == 10_000


def test_snapshot_jpeg_has_the_frame_size_and_the_boxes():
    store = SnapshotStore(clock=lambda: 0.0)
    store.add("cam")
    image = np.full((240, 320, 3), 90, np.uint8)
    dets = Detections(np.array([[40, 60, 200, 180]], np.float32), np.array([0.8], np.float32),
                      np.array([3], np.int32), 320, 240)
    store.offer(_frame(image, 7))
    image[:] = 0  # the reader reuses its buffer: the snapshot must not change with it
    store.published("cam", 7, 7.0, 1007.0, dets, ("a", "b", "c", "car"))
    jpeg = store.latest_jpeg("cam")
    decoded = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert decoded.shape == (240, 320, 3)
    diff = np.abs(decoded.astype(np.int16) - 90).max(axis=2)
    rows, cols = edge_pixels([40, 60, 200, 180], 320, 240)
    assert diff[rows, cols].mean() > 40
    assert diff[200:236, 240:316].mean() < 4  # away from the box and its label


def test_an_unwatched_camera_keeps_a_jpeg_not_frames_until_its_snapshot_is_asked_for():
    """Two frame-sized buffers per camera were 12.4 MB at 1080p whether anyone looked or not.
    Unwatched, one frame every idle_interval_s is kept as a JPEG; asking makes the camera watched
    (full copies at copies_per_s, at once), and watch_s after the last request the buffers go."""
    from yoloedge.sources.synthetic import textured_frame

    now = [0.0]
    store = SnapshotStore(copies_per_s=2.0, clock=lambda: now[0], watch_s=60.0, idle_interval_s=10.0)
    store.add("cam")
    image = textured_frame(1280, 720)
    dets = Detections(np.array([[100, 100, 400, 500]], np.float32), np.array([0.9], np.float32),
                      np.array([0], np.int32), 1280, 720)
    seq = [0]

    def run(seconds: float) -> set[int]:
        """Frames at 8 fps, each published; the snapshots' frame numbers."""
        shown = set()
        for _ in range(int(seconds * 8)):
            store.offer(_frame(image, seq[0]))
            store.published("cam", seq[0], float(seq[0]), 1000.0 + seq[0], dets, ("person",))
            shown.add(store._cameras["cam"].seq)
            seq[0] += 1
            now[0] += 0.125
        return shown

    assert run(30) == {0, 80, 160}  # one keepsake every 10 s, from the first frame on
    assert store.allocations("cam") == 0 and store.raw_bytes("cam") == 0
    first = store.latest("cam")  # answered at once, from the keepsake
    assert isinstance(first, Snapshot) and first.seq == 160 and (first.width, first.height) == (1280, 720)
    shot = cv2.imdecode(np.frombuffer(first.jpeg, np.uint8), cv2.IMREAD_COLOR).astype(np.int16)
    assert np.abs(shot[600:700, 600:1200] - image[600:700, 600:1200]).mean() < 4  # away from the box
    rows, cols = edge_pixels([100, 100, 400, 500], 1280, 720)
    assert np.abs(shot - image).max(axis=2)[rows, cols].mean() > 40

    watched = run(20)  # watched: the next frame at once, then 2 a second, in two buffers
    assert min(watched - {160}) == 240 and len(watched - {160}) == 40
    assert store.allocations("cam") == 2 and store.raw_bytes("cam") == 2 * image.nbytes
    fresh = store.latest("cam")
    assert isinstance(fresh, Snapshot) and fresh.seq == max(watched)

    run(61)  # 60 s after the last request: back to keepsakes, the buffers freed
    assert store.raw_bytes("cam") == 0 and store.allocations("cam") == 2
    assert store.latest("cam").seq > max(watched)


def test_a_keepsake_of_a_camera_that_stopped_stays_its_snapshot():
    """A camera that ended or went silent still shows its last kept frame."""
    now = [0.0]
    store = SnapshotStore(clock=lambda: now[0])
    store.add("cam")
    image = np.full((240, 320, 3), 90, np.uint8)
    dets = Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32), 320, 240)
    store.offer(_frame(image, 3))
    store.published("cam", 3, 3.0, 1003.0, dets, ("person",))
    now[0] += 3600
    snap = store.latest("cam")
    assert isinstance(snap, Snapshot) and snap.seq == 3 and snap.detections == []
    assert store.raw_bytes("cam") == 0


def test_a_stuck_watcher_never_blocks_publishing_nor_status(tmp_path):
    hub = WatchHub(max_lines=64)
    server = ControlServer(str(tmp_path / "c.sock"), 0o600, lambda req: {"ok": True, "cmd": req["cmd"]},
                           streams={"watch": hub.opener(lambda name: name == "cam")})
    with server:
        assert request(server.path, {"cmd": "watch", "camera": "nope"})["reason"] == "unknown_camera"
        stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.connect(server.path)
        stuck.sendall(b'{"cmd": "watch", "camera": "cam"}\n')
        reader = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        reader.connect(server.path)
        reader.sendall(b'{"cmd": "watch"}\n')
        reader_file = reader.makefile("rb")
        assert json.loads(reader_file.readline()) == {"ok": True, "watching": None}
        deadline = time.monotonic() + 10
        while len(hub.stats()) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        message = {"camera": "cam", "frame": 0, "detections": [{"label": "x" * 2000}]}
        for frame in range(5000):  # ~10 MB for each watcher: far beyond any socket buffer
            hub.publish("cam", {**message, "frame": frame})
        stuck_stats = next(s for s in hub.stats() if s["camera"] == "cam")
        assert stuck_stats["dropped"] > 4000 and stuck_stats["queued"] <= 64
        assert request(server.path, {"cmd": "status"}, timeout=5) == {"ok": True, "cmd": "status"}
        # The reader that keeps up is told what it lost, then gets the newest lines in order.
        seen, dropped = [], 0
        reader.settimeout(10)
        while not seen or seen[-1] != 4999:
            line = json.loads(reader_file.readline())
            if line["event"] == "dropped":
                dropped = line["total"]
            else:
                seen.append(line["message"]["frame"])
        assert seen == sorted(seen) and dropped + len(seen) >= 5000 - 64 * 2
        stuck.close()
        reader_file.close()
        reader.close()
        deadline = time.monotonic() + 10
        while hub.stats() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert hub.stats() == [], "a watcher that disconnected is still subscribed"

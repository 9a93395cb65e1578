"""The recent-events log and its best shots (`events.recent.EventLog`), in process: what it keeps,
the byte budget, the encoding rate per event on frame time, that it keeps no frame, and readers
against the writer on other threads. Frames are small synthetic images: milliseconds per test."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import cv2
import numpy as np
import pytest

from yoloedge.events.recent import (DEFAULT_LIMIT, ENCODE_INTERVAL_S, MAX_LIMIT, EventLog, events_reply, read_limit,
                                    valid_event_id)

BOX = (20.0, 16.0, 100.0, 80.0)


def message(event_id: str, camera: str = "gate", kind: str = "new", **extra) -> dict:
    return {"v": 1, "type": kind, "id": event_id, "camera": camera, "label": "person", "start_time": 1000.0,
            "end_time": None, "frame_time": 1000.0, "score": 0.8, "top_score": 0.8, **extra}


def grey(width: int = 160, height: int = 120, value: int = 90) -> np.ndarray:
    return np.full((height, width, 3), value, np.uint8)


def noisy(seed: int, width: int = 160, height: int = 120) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)


def decoded(jpeg: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None, "not a JPEG"
    return image


def test_recent_keeps_each_events_latest_message_newest_first():
    log = EventLog(max_events=3)
    log.record(message("a"))
    log.record(message("b", camera="dock"))
    log.record(message("a", kind="update", score=0.9))
    log.record(message("c"))
    assert [(e["id"], e["type"]) for e in log.recent()] == [("c", "new"), ("b", "new"), ("a", "update")]
    assert [e["id"] for e in log.recent("gate")] == ["c", "a"] and log.recent("nowhere") == []
    assert [e["id"] for e in log.recent(limit=1)] == ["c"]
    assert all(e["jpeg"] is None for e in log.recent()), "no shot yet"
    for name in "defg":
        log.record(message(name))
    assert [e["id"] for e in log.recent("gate")] == ["g", "f", "e"], "at most max_events per camera"
    assert [e["id"] for e in log.recent("dock")] == ["b"], "another camera's events are its own"
    with pytest.raises(ValueError, match="id"):
        log.record({"type": "new", "camera": "gate"})


def test_a_best_shot_is_the_frame_with_its_box_and_the_frame_is_left_alone():
    log = EventLog()
    log.record(message("a"))
    image = grey()
    before = image.copy()
    log.best_shot("gate", "a", image, BOX, 0.87, 1000.5)
    assert np.array_equal(image, before), "the box was drawn on the shared frame itself"
    shot = decoded(log.snapshot("a"))
    assert shot.shape == image.shape
    changed = np.abs(shot.astype(np.int16) - 90).max(axis=2) > 40
    x1, y1, x2, y2 = (int(v) for v in BOX)
    assert changed[y1 + 10:y2 - 10, x2].all() and changed[y2, x1 + 10:x2 - 10].all(), "no box drawn"
    assert not changed[y2 + 10:, x2 + 10:].any(), "pixels away from the box changed"
    assert changed[:y1, x1:x1 + 40].any(), "no label tag above the box"
    entry = log.recent()[0]
    assert entry["jpeg"] == {"frame_time": 1000.5, "score": 0.87, "box": list(BOX), "bytes": len(log.snapshot("a"))}
    assert log.snapshot("nope") is None


def test_a_shot_of_a_scaled_down_frame_has_its_box_where_the_object_is():
    # the frame keeper keeps large frames scaled down: the box (source pixels) is scaled with it,
    # while the shot's metadata keeps the source's
    log = EventLog()
    log.record(message("a"))
    source_box = (40.0, 32.0, 200.0, 160.0)  # in a 320x240 source, kept at half size
    log.best_shot("gate", "a", grey(), source_box, 0.9, 1000.0, scale=0.5)
    changed = np.abs(decoded(log.snapshot("a")).astype(np.int16) - 90).max(axis=2) > 40
    x1, y1, x2, y2 = (int(v / 2) for v in source_box)  # == BOX
    assert changed[y1 + 10:y2 - 10, x2].all() and changed[y2, x1 + 10:x2 - 10].all()
    assert not changed[y2 + 10:, x2 + 10:].any()
    assert log.recent()[0]["jpeg"]["box"] == list(source_box)


def test_gray_and_bgra_frames_get_a_colour_shot():
    log = EventLog()
    log.best_shot("gate", "g", np.full((60, 80), 90, np.uint8), (5, 5, 40, 40), 0.5, 1.0)
    log.best_shot("gate", "r", np.full((60, 80, 4), 90, np.uint8), (5, 5, 40, 40), 0.5, 1.0)
    assert decoded(log.snapshot("g")).shape == (60, 80, 3) and decoded(log.snapshot("r")).shape == (60, 80, 3)


def test_at_most_one_encoding_per_second_of_frame_time_per_event():
    log = EventLog()
    log.record(message("a"))
    log.record(message("b"))
    times = [1000.0, 1000.5, 1000.99, 1001.0, 1001.2, 1002.5]
    for i, t in enumerate(times):
        log.best_shot("gate", "a", noisy(i), BOX, 0.5 + i / 100, t)
    log.best_shot("gate", "b", noisy(99), BOX, 0.5, 1000.2)  # another event has its own second
    stats = log.stats()
    assert (stats["encoded"], stats["skipped"]) == (4, 3)
    assert ENCODE_INTERVAL_S == 1.0
    kept = next(e for e in log.recent() if e["id"] == "a")["jpeg"]
    assert kept["frame_time"] == 1002.5 and kept["score"] == 0.55, "the newest encoded candidate is kept"
    reference = EventLog()
    reference.record(message("a"))
    reference.best_shot("gate", "a", noisy(5), BOX, 0.55, 1002.5)
    assert log.snapshot("a") == reference.snapshot("a"), "the kept JPEG is of that candidate's frame"
    log.best_shot("gate", "a", noisy(6), BOX, 0.9, 990.0)  # the clock stepped back: not stuck for 12 s
    assert log.stats()["encoded"] == 5


def test_no_reference_to_the_frame_is_kept():
    log = EventLog()
    log.record(message("a"))
    image = noisy(1)
    alive = weakref.ref(image)
    count = sys.getrefcount(image)
    log.best_shot("gate", "a", image, BOX, 0.9, 1000.0)
    log.best_shot("gate", "a", image, BOX, 0.95, 1002.0)
    assert sys.getrefcount(image) == count
    del image
    gc.collect()
    assert alive() is None, "the log still holds the frame"
    assert log.snapshot("a") is not None


def shot_size(image: np.ndarray) -> int:
    probe = EventLog()
    probe.record(message("x"))
    probe.best_shot("gate", "x", image, BOX, 0.9, 0.0)
    return len(probe.snapshot("x"))


def test_the_budget_drops_the_oldest_events_shots_first():
    image = noisy(7)
    size = shot_size(image)
    log = EventLog(budget_bytes=3 * size + size // 2)
    for name in "abcd":
        log.record(message(name))
        log.best_shot("gate", name, image, BOX, 0.9, 0.0)
    assert log.snapshot("a") is None and all(log.snapshot(n) for n in "bcd")
    stats = log.stats()
    assert stats["cameras"]["gate"]["snapshot_bytes"] == 3 * size and stats["evicted"] == 1
    assert [e["jpeg"] is None for e in log.recent()] == [False, False, False, True]
    assert [e["id"] for e in log.recent()] == ["d", "c", "b", "a"], "the event stays, without its shot"

    # Replacing b's shot with a larger one makes room by dropping c's (the oldest besides b).
    bigger = noisy(8, 200, 150)
    log.best_shot("gate", "b", bigger, BOX, 0.95, 5.0)
    assert log.snapshot("b") is not None and log.snapshot("c") is None and log.snapshot("d") is not None
    kept = log.stats()["cameras"]["gate"]["snapshot_bytes"]
    assert kept == len(log.snapshot("b")) + len(log.snapshot("d")) <= 3 * size + size // 2

    # A smaller budget applies at once; a shot larger than the whole budget is not kept.
    log.configure("gate", size)
    assert log.snapshot("b") is None and log.snapshot("d") is not None
    log.record(message("e"))
    log.best_shot("gate", "e", bigger, BOX, 0.9, 0.0)
    assert log.snapshot("e") is None and log.stats()["cameras"]["gate"]["snapshot_bytes"] <= size
    log.configure("gate", 0)
    log.best_shot("gate", "d", image, BOX, 0.9, 50.0)
    assert log.snapshot("d") is None and log.stats()["cameras"]["gate"]["snapshot_bytes"] == 0


def test_events_pushed_out_by_max_events_take_their_shots_along():
    image = noisy(3)
    log = EventLog(max_events=2)
    for name in "abc":
        log.record(message(name))
        log.best_shot("gate", name, image, BOX, 0.9, 0.0)
    assert log.snapshot("a") is None
    assert log.stats()["cameras"]["gate"]["snapshot_bytes"] == len(log.snapshot("b")) + len(log.snapshot("c"))


def test_forget_camera_drops_its_events_and_shots_only():
    log = EventLog()
    for camera in ("gate", "dock"):
        log.record(message(camera + "-1", camera=camera))
        log.best_shot(camera, camera + "-1", grey(), BOX, 0.9, 0.0)
    log.forget_camera("gate")
    assert log.snapshot("gate-1") is None and log.recent("gate") == []
    assert log.snapshot("dock-1") is not None and [e["id"] for e in log.recent()] == ["dock-1"]
    assert list(log.stats()["cameras"]) == ["dock"]


def test_readers_on_other_threads_see_a_consistent_log_while_the_router_writes():
    image = noisy(11, 96, 72)
    size = shot_size(image)
    budget = 5 * size
    log = EventLog(budget_bytes=budget, max_events=20)
    done = threading.Event()
    failures: list[str] = []

    def write() -> None:
        try:
            for i in range(400):
                event_id = f"e{i % 40}"
                log.record(message(event_id, kind="update", score=i))
                log.best_shot("gate", event_id, image, BOX, 0.9, float(i))
        finally:
            done.set()

    def read() -> None:
        while not done.is_set():
            events = log.recent(limit=MAX_LIMIT)
            stats = log.stats()["cameras"].get("gate")
            if len({e["id"] for e in events}) != len(events) or len(events) > 20:
                failures.append(f"{len(events)} events, ids repeated or beyond max_events")
            if stats is not None and stats["snapshot_bytes"] > budget:
                failures.append(f"{stats['snapshot_bytes']} bytes kept, budget {budget}")
            for e in events[:3]:
                jpeg = log.snapshot(e["id"])
                if jpeg is not None and not jpeg.startswith(b"\xff\xd8"):
                    failures.append("a snapshot that is not a JPEG")

    readers = [threading.Thread(target=read) for _ in range(2)]
    writer = threading.Thread(target=write)
    for thread in (*readers, writer):
        thread.start()
    for thread in (writer, *readers):
        thread.join(60)
    assert not failures, failures[:5]
    events = log.recent(limit=MAX_LIMIT)
    assert len(events) == 20
    kept = sum(e["jpeg"]["bytes"] for e in events if e["jpeg"] is not None)
    assert kept == log.stats()["cameras"]["gate"]["snapshot_bytes"] <= budget


def test_events_reply_and_its_checks():
    log = EventLog()
    log.record(message("a"))
    known = {"gate", "dock"}.__contains__
    assert events_reply(log, None, None, known) == {"ok": True, "camera": None, "events": log.recent()}
    assert events_reply(log, "dock", "5", known)["events"] == []
    assert events_reply(log, "nowhere", None, known)["reason"] == "unknown_camera"
    for bad in (0, -1, MAX_LIMIT + 1, "x", "1e3", "\u00b2", True, 2.5, "9" * 40):
        assert events_reply(log, None, bad, known)["reason"] == "bad_request", bad
    assert events_reply(log, 7, None, known)["reason"] == "bad_request"
    assert read_limit(None) == DEFAULT_LIMIT and read_limit("12") == 12 and read_limit(MAX_LIMIT) == MAX_LIMIT


@pytest.mark.parametrize("text, ok", [("lq3x2a-17", True), ("gate:1a2b-3", True), ("caf\u00e9-1", True),
                                      ("", False), (".", False), ("..", False), ("a/b", False), ("..\\x", False),
                                      ("a b", False), ("a\x00", False), ("x" * 257, False)])
def test_event_ids_are_checked_before_any_lookup(text, ok):
    assert valid_event_id(text) is ok

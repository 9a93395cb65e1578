"""What a reload leaves behind, on a daemon object the test drives in-process (real ONNX Runtime
on the demo model, real synthetic cameras; no MQTT broker is needed for this):

* the pictures of cameras a reload removed are freed at once, by reference counting, not whenever
  the cyclic garbage collector next runs -- reloads alternating 0 and 64 cameras used to climb
  hundreds of MB before a collection gave it back;
* `status()` on another thread never trips over the MQTT client a reload is replacing.
"""

from __future__ import annotations

import functools
import gc
import threading
import time
import tracemalloc
import weakref
from pathlib import Path

import pytest

from daemon_harness import write_config
from yoloedge import demo
from yoloedge.config.loader import load_config
from yoloedge.daemon import Daemon, DaemonState
from yoloedge.heap import release_free_heap, resident_bytes
from yoloedge.publish.mqtt import MqttPublisher
from yoloedge.pipeline.intake import Resized

#: cameras per reload, and their (synthetic) frame size
CAMERAS = 4
FRAME = (640, 360)


def config_dict(tmp_path: Path, cameras: int) -> dict:
    width, height = FRAME
    return {
        "device_id": "reload", "model": {"path": str(demo.MODEL)},
        "accelerators": [{"backend": "onnxruntime", "provider": "cpu", "devices": [0], "batch": 1}],
        "cameras": [{"name": f"cam{i}", "url": f"synthetic://{width}x{height}?fps=10"} for i in range(cameras)],
        "mqtt": {"host": "127.0.0.1", "port": 1883},
        "control": {"socket": str(tmp_path / "control.sock")},
        "shutdown_timeout_s": 5,
    }


@pytest.fixture
def daemon(tmp_path):
    """A daemon with its accelerator running and no camera; the test plays its main loop."""
    path = write_config(tmp_path / "yoloedge.yaml", config_dict(tmp_path, 0))
    daemon = Daemon(load_config(str(path), {}), str(path), {})
    assert daemon._start_accelerators(daemon.config)
    daemon._transition(DaemonState.RUNNING)  # as `run` does once started: reloads come after that
    yield daemon
    for name in list(daemon.cameras.runtimes):
        daemon.cameras.remove(name)
    for group in daemon.groups.values():
        group.stop_preparers(5)
        group.stop_workers(5)
        group.stop_post(5)


def wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached within {timeout} s"
        time.sleep(0.02)


def reload_with(daemon: Daemon, tmp_path: Path, cameras: int) -> None:
    write_config(Path(daemon.config_path), config_dict(tmp_path, cameras))
    generation = daemon.reloader.generation
    daemon.reloader.reload()  # what the main loop does on SIGHUP
    assert daemon.reloader.generation == generation + 1, daemon.reloader.config_error
    assert len(daemon.cameras.runtimes) == cameras


def camera_threads_ended() -> bool:
    return not any(t.name.startswith("camera-") for t in threading.enumerate())


def main_loop_tick(daemon: Daemon) -> None:
    """What the main loop does after a reload that removed cameras, once their threads ended."""
    wait_for(camera_threads_ended, what="the removed cameras' threads' end")
    daemon.cameras.give_back_memory(time.monotonic())


def ring_pictures() -> list[weakref.ref]:
    """Every camera picture buffer that exists now, wherever it is held (ring, queue, preparer):
    found through the interpreter's object list, which needs no collection."""
    return [weakref.ref(o.image) for o in gc.get_objects() if isinstance(o, Resized) and o.image is not None]


def all_dead(refs: list[weakref.ref]) -> bool:
    return all(ref() is None for ref in refs)


def test_a_reload_that_removes_cameras_frees_their_pictures_without_the_cyclic_collector(daemon, tmp_path):
    gc.collect()
    gc.disable()  # what is freed here is freed by reference counting alone
    tracemalloc.start()
    try:
        held_after: list[int] = []
        for cycle in range(6):
            reload_with(daemon, tmp_path, CAMERAS)
            # each camera has cycled through its whole ring (a picture per frame, oldest first)
            wait_for(lambda: all(c.reader.stats()["frames_out"] > 2 * max(q.maxsize for q in c.feed.queues.values()) + 4
                                 for c in daemon.cameras.runtimes.values()), what="frames from every camera")
            pictures = ring_pictures()
            assert len(pictures) >= CAMERAS
            reload_with(daemon, tmp_path, 0)
            # freed by reference counting alone, as soon as nobody uses them: a preparer may still
            # be placing one (milliseconds); cycles would keep them for good with the collector off
            wait_for(functools.partial(all_dead, pictures), timeout=10,
                     what=f"cycle {cycle}: the {len(pictures)} pictures of removed cameras freed")
            # a capture thread may still sit in its last read, holding that one frame: let it end
            main_loop_tick(daemon)
            held_after.append(tracemalloc.get_traced_memory()[0])
        picture_bytes = FRAME[0] * FRAME[1] * 3  # one frame: far less than one camera's pictures
        # memory held with no camera does not grow with the number of reloads
        assert held_after[5] - held_after[1] < picture_bytes, held_after
    finally:
        tracemalloc.stop()
        gc.enable()


def free_memory_in_a_thread_arena(megabytes: int) -> bytearray:
    """Allocate and free `megabytes` in 100 kB pieces (from the heap, not mmap) on another thread,
    as camera threads do; the piece returned (allocated last) keeps the allocator from handing
    the rest back on its own."""
    kept: list[bytearray] = []

    def work() -> None:
        pieces = [bytearray(100_000) for _ in range(megabytes * 10)]
        kept.append(pieces[-1])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    return kept[0]


def test_a_reload_that_removes_cameras_returns_the_freed_memory_to_the_system(daemon, tmp_path):
    if resident_bytes() is None or release_free_heap() is None:
        pytest.skip("needs /proc and glibc's malloc_trim")
    reload_with(daemon, tmp_path, CAMERAS)
    wait_for(lambda: all(c.reader.stats()["frames_out"] > 0 for c in daemon.cameras.runtimes.values()),
             what="frames from every camera")
    pin = free_memory_in_a_thread_arena(200)
    before = resident_bytes()
    reload_with(daemon, tmp_path, 0)
    main_loop_tick(daemon)
    dropped = before - resident_bytes()
    assert dropped > 150 * 2**20, f"RSS went down by {dropped / 2**20:.0f} MB only"
    assert len(pin) == 100_000


class SwappedUnderfoot(Daemon):
    """A daemon whose MQTT client a reload on another thread swaps (client <-> None) right after
    each read of `publisher` by the status thread: the race's window, made as wide as it gets and
    hit every time, with no reliance on timing."""

    def __init__(self, *args, **kwargs):
        self._publisher = None
        self.status_thread: threading.Thread | None = None
        self.was_read, self.swapped = threading.Event(), threading.Event()
        super().__init__(*args, **kwargs)

    @property
    def publisher(self):
        value = self._publisher
        if threading.current_thread() is self.status_thread:
            self.was_read.set()
            assert self.swapped.wait(30), "the swapping thread did not answer"
            self.swapped.clear()
        return value

    @publisher.setter
    def publisher(self, value):
        self._publisher = value


def test_status_never_trips_over_the_mqtt_client_a_reload_is_replacing(tmp_path):
    path = write_config(tmp_path / "yoloedge.yaml", config_dict(tmp_path, 0))
    config = load_config(str(path), {})
    daemon = SwappedUnderfoot(config, str(path), {})
    client = MqttPublisher(config.mqtt, config.device_id, "test")  # never started: stats() only
    daemon.publisher = client
    done = threading.Event()

    def swap() -> None:  # what `_replace_publisher` does to the attribute: the client goes, a client comes
        while not done.is_set():
            if daemon.was_read.wait(0.05):
                daemon.was_read.clear()
                daemon._publisher = None if daemon._publisher is not None else client
                daemon.swapped.set()

    errors: list[BaseException] = []
    mqtt_sections: list[dict] = []

    def ask() -> None:
        try:
            for _ in range(10):
                mqtt_sections.append(daemon.status()["mqtt"])
                assert daemon._status_line().endswith("mqtt disconnected")
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    swapper = threading.Thread(target=swap)
    daemon.status_thread = threading.Thread(target=ask)
    swapper.start()
    daemon.status_thread.start()
    daemon.status_thread.join(60)
    done.set()
    swapper.join(10)
    assert not errors, repr(errors[0])
    assert len(mqtt_sections) == 10
    assert {} in mqtt_sections and any(m.get("broker") for m in mqtt_sections)  # it did change underfoot

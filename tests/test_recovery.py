"""Devices that recover: a card whose inferences fail, or whose call hangs, is released and opened
again on a fresh thread while its sibling goes on serving, and nothing is leaked on the way.

Two cards, each exercised the same way on two runtimes: the fake pyACL (its own fault injection:
`_fake.fail` for error codes, `_fake.hold` for a call that hangs, and its allocation bookkeeping
for leaks) and the real ONNX Runtime backend (a subclass defined here, so no production code path
knows about faults). Each worker runs on its own injected clock: hang deadlines and restart
backoffs pass when the test says so, for that card only (moving a shared clock would also abandon
a sibling that happens to be mid-call), and waits are for events, not for rates. The daemon tests
at the end drive `yoloedge run` with two devices, one of which hangs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

FAKES = Path(__file__).resolve().parent / "fakes"
if str(FAKES) not in sys.path:
    sys.path.insert(0, str(FAKES))

import acl  # noqa: E402  (the fake: tests/fakes is first on sys.path)

from daemon_harness import status  # noqa: E402
from onnx_models import make_dynamic_batch_v8_model  # noqa: E402
import test_daemon  # noqa: E402  (its config and fixtures drive the daemon here too)
from yoloedge.backends import acl_runtime  # noqa: E402
from yoloedge.backends.onnxruntime import OnnxRuntimeBackend  # noqa: E402
from yoloedge.config import AcceleratorConfig, ModelConfig  # noqa: E402
from yoloedge.errors import BackendError  # noqa: E402
from yoloedge.health.progress import DeviceHealth, ProgressTracker  # noqa: E402
from yoloedge.model import identity  # noqa: E402
from yoloedge.pipeline.batcher import Batcher  # noqa: E402
from yoloedge.pipeline.intake import CameraIntake  # noqa: E402
from yoloedge.pipeline.post import PostStage  # noqa: E402
from yoloedge.pipeline.prepare import Preparer  # noqa: E402
from yoloedge.pipeline import incarnation as incarnation_module  # noqa: E402
from yoloedge.pipeline import worker as worker_module  # noqa: E402
from yoloedge.pipeline.worker import DeviceWorker, RestartPolicy, WorkerState  # noqa: E402
from yoloedge.pipeline.served import ServedModel  # noqa: E402
from yoloedge.preprocess import Resizer  # noqa: E402
from yoloedge.sources.frame import Frame  # noqa: E402

SIZE = 64
TIMEOUT_S = 5.0  # inference_timeout_s, on the injected clock
POLICY = RestartPolicy(first_delay_s=1.0, max_delay_s=4.0, healthy_reset_s=1000.0)
CAMERAS = ("a", "b")


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


class Clock:
    """A worker's clock: moves only when the test advances it. `reads` counts the looks at it
    (the supervisor looks on every round), so a test can wait until it has looked again."""

    def __init__(self):
        self._t = 1000.0
        self._lock = threading.Lock()
        self.reads = 0

    def __call__(self) -> float:
        with self._lock:
            self.reads += 1
            return self._t

    def looked_again(self, times: int = 3) -> None:
        """Wait until the clock was read `times` more times (the supervisor's rounds)."""
        start = self.reads
        wait_until(lambda: self.reads >= start + times, what="the supervisor to look again")

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._t += seconds


class Sink:
    """Post-processing's sink: (camera, seq, device) of every frame published, in call order."""

    def __init__(self):
        self.items: list[tuple[str, int, str]] = []
        self._lock = threading.Lock()
        self.keep_from: str | None = None  # post-processing keeps the next output set of this device
        self.kept: list = []

    def __call__(self, meta, dets, output_set):
        with self._lock:
            self.items.append((meta.camera, meta.seq, output_set.device))
            if self.keep_from == output_set.device:
                self.keep_from = None
                self.kept.append(output_set)
                output_set.release = lambda: None  # never handed back, like a stuck post thread

    def __len__(self):
        with self._lock:
            return len(self.items)

    def snapshot(self):
        with self._lock:
            return list(self.items)


class Rig:
    """Batcher, preparers, two device workers and post-processing, wired as an accelerator group."""

    def __init__(self, model: str, factories, max_errors=2):
        self.clocks = [Clock() for _ in factories]
        self.tracker = ProgressTracker()
        self.batcher = Batcher(timeout_s=0.01)
        self.sink = Sink()
        self.post = PostStage("rig", self.sink, max_threads=2)
        acc = AcceleratorConfig(batch=2, max_consecutive_errors=max_errors, inference_timeout_s=TIMEOUT_S)
        cfg = ModelConfig(path=model, format="v8", labels=["red", "blue"], conf=0.1)
        self.workers = [DeviceWorker(f"rig/{d}", acc, d, [ServedModel(cfg, self.batcher, self.post, factory)],
                                     self.tracker, clock=self.clocks[d], restart=POLICY)
                        for d, factory in enumerate(factories)]
        self.post.start()
        for w in self.workers:
            w.start()
        for w in self.workers:
            assert w.ready.wait(60) and w.state is WorkerState.RUNNING, w.startup_error
        detector = self.workers[0].detector
        self.preparers = [Preparer(f"prep{i}", self.batcher, detector.new_letterboxer(), lambda *a: None)
                          for i in range(2)]
        for p in self.preparers:
            p.start()
        self.intakes = {c: CameraIntake(self.batcher.add_camera(c, 8, True),
                                        Resizer(detector.input.height, detector.input.width, detector.style),
                                        CameraIntake.ring_size(8, 2)) for c in CAMERAS}
        self.fed = 0
        self._seq = dict.fromkeys(CAMERAS, 0)

    def feed(self, per_camera: int, wait_s: float = 30.0) -> None:
        """Queue frames (lossless): a full queue waits up to `wait_s`, then the frame is not fed."""
        for _ in range(per_camera):
            for camera, intake in self.intakes.items():
                image = np.zeros((SIZE, SIZE, 3), np.uint8)
                image[:] = (0, 0, 255)
                if intake(Frame(camera, self._seq[camera], image, time.time(), time.monotonic()), wait_s):
                    self._seq[camera] += 1
                    self.fed += 1
                else:
                    assert wait_s < 30.0, f"camera {camera}: no room for 30 s"

    @property
    def lost(self) -> int:
        return sum(w.stats.frames_lost for w in self.workers)

    def settle(self, what: str) -> None:
        """Every frame fed is published or counted lost: none is stuck behind a ticket."""
        wait_until(lambda: len(self.sink) + self.lost == self.fed, what=f"{what}: every frame accounted for")

    def feed_until(self, predicate, what: str) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, f"timed out feeding until {what}"
            self.feed(1, wait_s=0.05)
            time.sleep(0.005)

    def stop(self) -> None:
        for p in self.preparers:
            p.stop()
        for w in self.workers:
            w.stop()
        self.batcher.close()
        for t in (*self.preparers, *self.workers):
            t.join(30)
            assert not t.is_alive()
        assert self.post.stop(10)


def exercise(rig: Rig, fail_card1, hang_card1, held_calls, leaks=None) -> None:
    """Errors twice, then a hang, on card 1: card 0 serves throughout, card 1 comes back each time."""
    card0, card1 = rig.workers
    clock1 = rig.clocks[1]
    rig.feed(5)
    rig.settle("warm")
    baseline = leaks() if leaks else None
    for restart in (1, 2):
        fail_card1()
        rig.feed_until(lambda: card1.state is WorkerState.BACKOFF, "card 1 gives up after its errors")
        assert card1.last_error and "failed in a row" in card1.last_error
        assert any(p.source == "rig/1" for p in rig.tracker.check())
        assert rig.tracker.making_progress(), "card 0 is healthy: the watchdog must still be fed"
        rig.settle(f"card 1 down ({restart})")
        served_by_0 = sum(1 for *_, d in rig.sink.snapshot() if d == "rig/0")
        rig.feed(10)
        rig.settle("card 0 alone")
        assert sum(1 for *_, d in rig.sink.snapshot() if d == "rig/0") == served_by_0 + 20
        clock1.advance(POLICY.max_delay_s)
        wait_until(lambda n=restart: card1.state is WorkerState.RUNNING and card1.stats.restarts == n,
                   what=f"card 1 open again ({restart})")
        # Idle after its comeback, long past the deadline: the calls that failed are over, so
        # nothing may read as "inference running" (that stopped the watchdog of a recovered card).
        clock1.advance(TIMEOUT_S * 3)
        assert rig.tracker.check() == [], rig.tracker.check()
        if leaks:
            assert leaks() == baseline, f"restart {restart} leaked"

    hold = hang_card1()
    rig.feed_until(hold.is_set, "card 1's call hangs")
    before = card1.stats.frames_lost
    clock1.advance(TIMEOUT_S + 0.5)
    wait_until(lambda: card1.state is WorkerState.BACKOFF, what="the hung call abandoned")
    assert card1.hung_calls == 1 and card1.stats.frames_lost > before, "the hung batch is given up, not waited for"
    assert "running for" in (card1.last_error or "")
    rig.feed(10)
    rig.settle("card 0 serves while card 1 hangs")
    clock1.advance(POLICY.max_delay_s)
    wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == 3, what="card 1 open again (3)")
    assert card1.hung_calls == 1, "the hung call still runs on its abandoned thread"
    served_by_1 = sum(1 for *_, d in rig.sink.snapshot() if d == "rig/1")
    rig.feed_until(lambda: sum(1 for *_, d in rig.sink.snapshot() if d == "rig/1") > served_by_1,
                   "card 1 serves again")
    held_calls()  # the hung call returns: its late results are discarded, its device released
    wait_until(lambda: card1.hung_calls == 0, what="the abandoned thread released its device")
    assert card1.stats.leaked_openings == 0
    rig.settle("after the hang")
    if leaks:
        assert leaks() == baseline, "the abandoned incarnation leaked"

    assert card0.stats.restarts == 0 and card0.state is WorkerState.RUNNING
    assert rig.tracker.check() == [] and rig.tracker.making_progress()
    status = card0.status()
    assert status["rebalanced"] > 0 and card1.status()["restarts"] == 3
    assert all(rig.batcher.rebalanced_of(c) > 0 for c in CAMERAS)
    for camera in CAMERAS:  # in order, each at most once, whichever card ran it
        seqs = [s for c, s, _ in rig.sink.snapshot() if c == camera]
        assert seqs == sorted(set(seqs)), camera


# -- the fake pyACL ---------------------------------------------------------------------------------
@pytest.fixture()
def fake_acl(monkeypatch):
    if not hasattr(acl, "_fake"):
        pytest.skip("the real pyACL is imported in this process; this test needs the fake")
    state = acl._fake.reset()
    monkeypatch.setattr(acl_runtime, "PROCESS", acl_runtime.AclProcess())
    return state


@pytest.fixture()
def tiny_om(tmp_path) -> Path:
    onnx_path = make_dynamic_batch_v8_model(str(tmp_path / "tiny.onnx"), size=SIZE, nc=2)
    om = tmp_path / "tiny.om"
    om.write_bytes(b"fake om: see the .fake.json next to it")
    Path(f"{om}.fake.json").write_text(json.dumps({"onnx": str(onnx_path), "batch": [1, 2]}))
    return om


def test_fake_ascend_card_recovers_from_errors_and_a_hang_without_leaks(fake_acl, tiny_om):
    from acl import _fake

    from yoloedge.backends.ascend import AscendBackend
    from yoloedge.config.ascend import AscendConfig

    rig = Rig(str(tiny_om), [lambda d=d: AscendBackend(str(tiny_om), AscendConfig(device_id=d)) for d in (0, 1)])
    holds = []

    def hang():
        holds.append(_fake.hold("acl.mdl.execute", device=1))
        return holds[-1].entered

    try:
        exercise(rig, lambda: _fake.fail("acl.mdl.execute", 507011, device=1, times=2), hang,
                 lambda: holds[-1].release(), leaks=_fake.leaks)
        assert _fake.STATE.counts["acl.rt.create_context"] == 5  # 2 cards + 3 restarts, each a fresh context
    finally:
        for h in holds:
            h.release()
        rig.stop()
    assert not any(_fake.leaks().values()), _fake.leaks()
    assert _fake.STATE.finalize_count == 1 and not _fake.STATE.finalize_refused


def test_the_only_fake_card_restarts_without_finalising_pyacl(fake_acl, tiny_om):
    """pyACL can be initialised once per process: a restart of the only card must not finalise it."""
    from acl import _fake

    from yoloedge.backends.ascend import AscendBackend
    from yoloedge.config.ascend import AscendConfig

    rig = Rig(str(tiny_om), [lambda: AscendBackend(str(tiny_om), AscendConfig(device_id=0))])
    card = rig.workers[0]
    try:
        baseline = _fake.leaks()
        _fake.fail("acl.mdl.execute", 507011, device=0, times=2 + 1)  # two in service, one at the reopening
        rig.feed_until(lambda: card.state is WorkerState.BACKOFF, "the card gives up")
        # No card left: frames wait in the cameras' bounded queues (lossless here), nothing else.
        assert rig.batcher.pending() <= 8 * len(CAMERAS)
        clock = rig.clocks[0]
        clock.advance(POLICY.max_delay_s)  # the first reopening fails (at its warm-up)
        wait_until(lambda: card.state is WorkerState.BACKOFF and card.next_retry_mono > clock(),
                   what="the failed reopening rescheduled")
        clock.advance(POLICY.max_delay_s)
        wait_until(lambda: card.state is WorkerState.RUNNING, what="the card open again")
        assert card.stats.restarts == 1 and _fake.leaks() == baseline
        assert _fake.STATE.init_count == 1 and _fake.STATE.finalize_count == 0
        rig.feed(4)
        rig.settle("served again")
    finally:
        rig.stop()
    assert _fake.STATE.finalize_count == 1 and not any(_fake.leaks().values()), _fake.leaks()


# -- ONNX Runtime ----------------------------------------------------------------------------------
class Faults:
    """Faults for `FaultyOrt` instances, per device: failing runs to come, and a gate that holds
    the next run until released."""

    def __init__(self):
        self.fail_left: dict[int, int] = {}
        self.gates: dict[int, tuple[threading.Event, threading.Event]] = {}  # entered, released
        self.open_gates: dict[int, tuple[threading.Event, threading.Event]] = {}  # the same for `open`

    def slow_open(self, device: int) -> tuple[threading.Event, threading.Event]:
        """The next opening of `device` waits until released: (entered, release)."""
        gate = self.open_gates[device] = (threading.Event(), threading.Event())
        return gate

    def hang(self, device: int) -> threading.Event:
        entered = threading.Event()
        self.gates[device] = (entered, threading.Event())
        return entered

    def take(self, device: int) -> tuple[threading.Event, threading.Event] | None:
        gate = self.gates.get(device)
        return None if gate is None or gate[0].is_set() else gate

    def release(self, device: int) -> None:
        self.gates.pop(device)[1].set()


class FaultyOrt(OnnxRuntimeBackend):
    """The real ONNX Runtime backend with the test's faults in front of `run` (test-only)."""

    def __init__(self, path: str, device: int, faults: Faults):
        super().__init__(path)
        self.device, self.faults = device, faults
        self.closed = False

    def open(self, *args, **kwargs):
        gate = self.faults.open_gates.pop(self.device, None)
        if gate is not None:
            gate[0].set()
            gate[1].wait(60)
        return super().open(*args, **kwargs)

    def close(self):
        self.closed = True
        super().close()

    def run(self, n, input_set=0, output_set=0):
        gate = self.faults.take(self.device)
        if gate is not None:
            gate[0].set()
            gate[1].wait(60)
        if self.faults.fail_left.get(self.device):
            self.faults.fail_left[self.device] -= 1
            raise BackendError("injected device error")
        return super().run(n, input_set, output_set)


def test_onnxruntime_device_recovers_from_errors_and_a_hang(tmp_path):
    model = make_dynamic_batch_v8_model(str(tmp_path / "m.onnx"), size=SIZE, nc=2)
    faults = Faults()
    rig = Rig(model, [lambda d=d: FaultyOrt(model, d, faults) for d in (0, 1)])

    def fail():
        faults.fail_left[1] = 2

    try:
        exercise(rig, fail, lambda: faults.hang(1), lambda: faults.release(1))
    finally:
        for device in list(faults.gates):
            faults.release(device)
        rig.stop()


def test_restart_backoff_doubles_and_a_failed_reopen_is_retried(tmp_path):
    """A card that cannot be opened again is retried after 1, 2, 4, 4 s (capped), never in a loop."""
    model = make_dynamic_batch_v8_model(str(tmp_path / "m.onnx"), size=SIZE, nc=2)
    faults = Faults()
    rig = Rig(model, [lambda d=d: FaultyOrt(model, d, faults) for d in (0, 1)])
    card1, clock = rig.workers[1], rig.clocks[1]
    try:
        faults.fail_left[1] = 2 + 3  # two in service, then the warm-up of three reopenings
        rig.feed_until(lambda: card1.state is WorkerState.BACKOFF, "card 1 gives up")
        delays = []
        for _ in range(3):
            delays.append(round(card1.next_retry_mono - clock(), 3))
            clock.advance(delays[-1])
            wait_until(lambda: card1.state is WorkerState.BACKOFF and card1.next_retry_mono > clock(),
                       what="the reopening failed and is scheduled again")
            assert "injected device error" in card1.last_error
        delays.append(round(card1.next_retry_mono - clock(), 3))
        assert delays == [1.0, 2.0, 4.0, 4.0]
        clock.advance(4.0)
        wait_until(lambda: card1.state is WorkerState.RUNNING, what="card 1 open again")
        assert card1.stats.restarts == 1
        rig.feed(4)
        rig.settle("after the reopening")
    finally:
        rig.stop()


def ort_rig(tmp_path, faults, factories=None):
    model = make_dynamic_batch_v8_model(str(tmp_path / "m.onnx"), size=SIZE, nc=2)
    return Rig(model, factories or [lambda d=d: FaultyOrt(model, d, faults) for d in (0, 1)]), model


def test_a_reopening_slower_than_the_inference_deadline_is_waited_for(tmp_path):
    """Loading, allocating and warming up may take far longer than an inference (a TensorRT
    engine, a big .om file): a reopening is abandoned only past the open deadline."""
    faults = Faults()
    rig, _ = ort_rig(tmp_path, faults)
    card1, clock = rig.workers[1], rig.clocks[1]
    entered, release = faults.slow_open(1)
    try:
        assert card1.open_deadline_s == worker_module.OPEN_DEADLINE_MIN_S > TIMEOUT_S
        faults.fail_left[1] = 2
        rig.feed_until(lambda: card1.state is WorkerState.BACKOFF, "card 1 gives up")
        clock.advance(POLICY.max_delay_s)
        assert entered.wait(30), "card 1 is reopened"
        clock.advance(3 * TIMEOUT_S)  # a slow load, far past the inference deadline
        clock.looked_again()
        assert card1.state is WorkerState.RESTARTING and card1.hung_calls == 0, card1.last_error
        release.set()
        wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == 1, what="card 1 open again")

        faults.fail_left[1] = 2  # once more, and this time the opening never ends
        entered, release = faults.slow_open(1)
        rig.feed_until(lambda: card1.state is WorkerState.BACKOFF, "card 1 gives up again")
        clock.advance(POLICY.max_delay_s)
        assert entered.wait(30)
        clock.advance(card1.open_deadline_s + 1)
        wait_until(lambda: card1.state is WorkerState.BACKOFF, what="the stuck opening abandoned")
        assert "reopening of the device running for" in card1.last_error and card1.hung_calls == 1
        release.set()
        wait_until(lambda: card1.hung_calls == 0, what="the abandoned opening released its device")
        clock.advance(POLICY.max_delay_s)
        wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == 2, what="card 1 open again")
        rig.feed(4)
        rig.settle("served again")
    finally:
        release.set()
        rig.stop()


def test_a_device_thread_that_dies_is_a_failure_not_a_running_device(tmp_path, monkeypatch):
    """An unexpected exception on the device thread (here: post-processing cannot start a thread)
    must not leave a dead device reported running, feeding the watchdog, holding a ticket."""
    monkeypatch.setattr(incarnation_module, "OUTPUT_WAIT_S", 0.2)
    faults = Faults()
    rig, _ = ort_rig(tmp_path, faults)
    card1, clock = rig.workers[1], rig.clocks[1]
    submit, failed = rig.post.submit, threading.Event()

    def flaky_submit(output_set):
        if output_set.device == card1.worker_name and not failed.is_set():
            failed.set()
            raise RuntimeError("can't start new thread")
        submit(output_set)

    monkeypatch.setattr(rig.post, "submit", flaky_submit)
    try:
        rig.feed_until(lambda: card1.state is WorkerState.BACKOFF, "card 1's thread fails")
        assert "can't start new thread" in card1.last_error
        assert [p.source for p in rig.tracker.check()] == ["rig/1"] and rig.tracker.making_progress()
        rig.settle("publishing does not wait for the lost batch")
        assert card1.stats.frames_lost > 0
        clock.advance(POLICY.max_delay_s)
        wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == 1, what="card 1 open again")
        assert rig.tracker.check() == []
        rig.feed(4)
        rig.settle("served again")
    finally:
        rig.stop()


def test_start_up_never_waits_for_a_device_thread_that_failed(tmp_path, monkeypatch):
    model = make_dynamic_batch_v8_model(str(tmp_path / "m.onnx"), size=SIZE, nc=2)
    batcher = Batcher(timeout_s=0.01)

    def refuse(*args, **kwargs):
        raise RuntimeError("no room for the buffers")

    monkeypatch.setattr(batcher, "add_buffers", refuse)
    post = PostStage("solo", Sink())
    acc = AcceleratorConfig(batch=2, inference_timeout_s=TIMEOUT_S)
    cfg = ModelConfig(path=model, format="v8", labels=["red", "blue"], conf=0.1)
    worker = DeviceWorker("solo/0", acc, 0, [ServedModel(cfg, batcher, post, lambda: OnnxRuntimeBackend(model))],
                          ProgressTracker(), clock=Clock(), restart=POLICY)
    post.start()
    worker.start()
    try:
        assert worker.ready.wait(30), "start-up waits forever"
        assert worker.state is WorkerState.FAILED and "no room for the buffers" in worker.startup_error
    finally:
        worker.stop()
        worker.join(30)
        assert not worker.is_alive()
        post.stop(10)


def test_status_does_not_wait_for_a_backend_being_constructed(tmp_path):
    """Building the next opening's backend may take long; status (and so `yoloedge-ctl status`)
    must answer meanwhile."""
    faults = Faults()
    model = make_dynamic_batch_v8_model(str(tmp_path / "m.onnx"), size=SIZE, nc=2)
    building, proceed = threading.Event(), threading.Event()
    made = []

    def card1_backend():
        if made:  # the spare for the next opening
            building.set()
            proceed.wait(60)
        made.append(FaultyOrt(model, 1, faults))
        return made[-1]

    rig = Rig(model, [lambda: FaultyOrt(model, 0, faults), card1_backend])
    card1 = rig.workers[1]
    try:
        faults.fail_left[1] = 2
        rig.feed_until(building.is_set, "card 1 gives up and prepares its next backend")
        answers = []
        asking = threading.Thread(target=lambda: answers.append(card1.status()), daemon=True)
        asking.start()
        asking.join(10)
        assert answers, "status waited for the backend being built"
        proceed.set()
        wait_until(lambda: card1.state is WorkerState.BACKOFF, what="card 1 let go")
        rig.clocks[1].advance(POLICY.max_delay_s)
        wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == 1, what="card 1 open again")
        assert card1.detector.backend is made[1], "the reopening uses the backend prepared for it"
    finally:
        proceed.set()
        rig.stop()


def test_device_memory_that_post_processing_still_holds_is_never_freed(tmp_path, monkeypatch):
    """Outputs may be views on device memory: a failed card whose output set is not handed back in
    time keeps its memory (counted), instead of freeing what post-processing may still read."""
    monkeypatch.setattr(incarnation_module, "OUTPUT_WAIT_S", 0.2)
    faults = Faults()
    rig, _ = ort_rig(tmp_path, faults)
    card1, clock = rig.workers[1], rig.clocks[1]
    first = card1.detector.backend
    try:
        rig.sink.keep_from = "rig/1"
        rig.feed_until(lambda: rig.sink.kept, "post-processing keeps an output set of card 1")
        faults.fail_left[1] = 2
        rig.feed_until(lambda: card1.state is WorkerState.BACKOFF, "card 1 gives up")
        wait_until(lambda: card1.stats.leaked_openings == 1, what="card 1's first opening left allocated")
        assert not first.closed, "device memory freed while post-processing holds it"
        assert card1.status()["leaked_openings"] == 1
        clock.advance(POLICY.max_delay_s)
        wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == 1, what="card 1 open again")
        rig.feed(4)
        rig.settle("served again")
    finally:
        rig.stop()


def test_no_device_is_opened_once_the_worker_is_stopped(tmp_path):
    faults = Faults()
    rig, _ = ort_rig(tmp_path, faults)
    card1 = rig.workers[1]
    rig.stop()
    generation = card1._generation
    card1._spawn()  # a restart that was due just as stop() came
    assert card1._generation == generation and card1.state is WorkerState.STOPPED


def _sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _other_input_shape(path: Path) -> Path:
    return make_dynamic_batch_v8_model(str(path), size=SIZE * 2, nc=2)


def _same_shape_other_weights(path: Path) -> Path:
    """The same model with its class masks swapped: red frames score as class 1, blue as 0."""
    import onnx

    graph = make_dynamic_batch_v8_model(str(path), size=SIZE, nc=2)
    proto = onnx.load(str(graph))
    names = {t.name: t for t in proto.graph.initializer}
    names["MASK0"].name, names["MASK1"].name = "MASK1", "MASK0"
    onnx.save(proto, str(graph))
    return graph


@pytest.mark.parametrize("make_other", [_other_input_shape, _same_shape_other_weights],
                         ids=["other-input-shape", "same-shape-other-weights"])
def test_a_model_file_changed_on_disk_is_not_loaded_by_a_reopening(tmp_path, make_other):
    """A model change needs a restart: a card reopened after a failure must not quietly load what
    now lies at `model.path` (another input shape loses every frame sent to it; the same shape
    mixes two models' detections in one camera). Refused, retried with backoff, and the card comes
    back once the original file is back."""
    faults = Faults()
    rig, model = ort_rig(tmp_path, faults)
    card1, clock = rig.workers[1], rig.clocks[1]
    original = Path(model).read_bytes()
    other = make_other(tmp_path / "other.onnx")
    assert other.read_bytes() != original
    try:
        Path(model).write_bytes(other.read_bytes())  # copied over model.path while the service runs
        faults.fail_left[1] = 2
        rig.feed_until(lambda: card1.state is WorkerState.BACKOFF, "card 1 gives up")
        for attempt in (1, 2):
            delay = card1.next_retry_mono - clock()
            clock.advance(delay)
            wait_until(lambda: card1.state is WorkerState.BACKOFF and card1.next_retry_mono > clock(),
                       what=f"reopening {attempt} refused and scheduled again")
            error = card1.status()["last_error"]
            assert f"model file {model} changed since the service started" in error, error
            assert hashlib.sha256(original).hexdigest()[:16] in error and _sha256(other)[:16] in error, error
            assert "restart the service" in error and "put the original back" in error, error
            assert card1.stats.restarts == 0 and card1.detector.backend.closed, "the card stays down"
            assert card1.next_retry_mono - clock() > delay, "retried with the usual (growing) backoff"
        assert [p.source for p in rig.tracker.check()] == ["rig/1"] and rig.tracker.making_progress()
        served_by_0 = sum(1 for *_, d in rig.sink.snapshot() if d == "rig/0")
        rig.feed(4)
        rig.settle("card 0 alone, with the model it loaded")
        assert sum(1 for *_, d in rig.sink.snapshot() if d == "rig/0") == served_by_0 + 8

        Path(model).write_bytes(original)  # the original is back
        clock.advance(card1.next_retry_mono - clock())
        wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == 1, what="card 1 open again")
        assert card1.detector.input.height == SIZE and len(card1.detector.labels) == 2
        served_by_1 = sum(1 for *_, d in rig.sink.snapshot() if d == "rig/1")
        rig.feed_until(lambda: sum(1 for *_, d in rig.sink.snapshot() if d == "rig/1") > served_by_1,
                       "card 1 serves again")
        rig.settle("after the original came back")
        assert rig.tracker.check() == []
    finally:
        rig.stop()


def test_model_identity_covers_the_labels_file_and_a_missing_model(tmp_path):
    """Labels read from a file are part of what an opening loads; a file gone, or replaced by a
    FIFO (which must not hang the check), is refused the same way."""
    model = make_dynamic_batch_v8_model(str(tmp_path / "m.onnx"), size=SIZE, nc=2)
    labels = tmp_path / "labels.txt"
    labels.write_text("red\nblue\n")
    recorded = identity.record(ModelConfig(path=str(model), labels=str(labels)))
    assert [(d.what, d.sha256) for d in recorded] == [("model file", _sha256(model)),
                                                      ("labels file", _sha256(labels))]
    identity.check_unchanged(recorded)  # nothing changed: no error
    labels.write_text("blue\nred\n")
    with pytest.raises(identity.ModelFileChanged, match=re.escape(f"labels file {labels} changed since the service")):
        identity.check_unchanged(recorded)
    labels.write_text("red\nblue\n")
    model.rename(tmp_path / "moved.onnx")
    with pytest.raises(identity.ModelFileChanged, match="cannot read model file .*put the original back"):
        identity.check_unchanged(recorded)
    os.mkfifo(model)
    with pytest.raises(identity.ModelFileChanged, match="not a regular file"):
        identity.check_unchanged(recorded)
    moved = str(tmp_path / "moved.onnx")
    for listed in (["a", "b"], None):  # labels from the config's list or the model: no other file
        assert [d.what for d in identity.record(ModelConfig(path=moved, labels=listed))] == ["model file"]


def test_a_card_at_its_hung_call_limit_says_it_waits_for_one_to_return(tmp_path, caplog):
    """Past `max_hung` abandoned calls the card is not opened again until one returns: status shows
    that (no retry time counting down to nothing), the log says it once, and the card comes back
    when a hung call returns."""
    caplog.set_level(logging.WARNING, logger=worker_module.__name__)
    faults = Faults()
    rig, _ = ort_rig(tmp_path, faults)
    card1, clock = rig.workers[1], rig.clocks[1]
    gates = []
    try:
        for hang in range(1, POLICY.max_hung + 1):
            entered = faults.hang(1)
            gates.append(faults.gates[1])
            rig.feed_until(entered.is_set, f"card 1's call hangs ({hang})")
            clock.advance(TIMEOUT_S + 0.5)
            wait_until(lambda n=hang: card1.state is WorkerState.BACKOFF and card1.hung_calls == n,
                       what=f"hung call {hang} abandoned")
            clock.advance(POLICY.max_delay_s)
            if hang < POLICY.max_hung:
                wait_until(lambda n=hang: card1.state is WorkerState.RUNNING and card1.stats.restarts == n,
                           what=f"card 1 open again ({hang})")
        wait_until(lambda: card1.state is WorkerState.WAITING_FOR_HUNG, what="card 1 waits for a hung call")
        for _ in range(3):  # however long it waits: the same status, one log line, no reopening
            clock.advance(POLICY.max_delay_s)
            clock.looked_again()
            status = card1.status()
            assert status["state"] == "hung-wait" and status["next_retry_in_s"] is None, status
            assert status["hung_calls"] == POLICY.max_hung and status["restarts"] == POLICY.max_hung - 1, status
        said = [r.getMessage() for r in caplog.records if "waits for one to return" in r.getMessage()]
        assert said == [f"rig/1: {POLICY.max_hung} abandoned device call(s) still running, the most allowed: "
                        "the device waits for one to return before it is opened again"], said
        rig.feed(4)
        rig.settle("card 0 serves while card 1 waits")

        gates[0][1].set()  # the first hung call returns
        wait_until(lambda: card1.state is WorkerState.RUNNING and card1.stats.restarts == POLICY.max_hung,
                   what="card 1 open again once a hung call returned")
        assert card1.hung_calls == POLICY.max_hung - 1 and card1.status()["next_retry_in_s"] is None
        gates[1][1].set()
        wait_until(lambda: card1.hung_calls == 0, what="the other abandoned call returned")
        served_by_1 = sum(1 for *_, d in rig.sink.snapshot() if d == "rig/1")
        rig.feed_until(lambda: sum(1 for *_, d in rig.sink.snapshot() if d == "rig/1") > served_by_1,
                       "card 1 serves again")
        rig.settle("after the hung calls returned")
    finally:
        for gate in gates:
            gate[1].set()
        rig.stop()


# -- the watchdog rule -----------------------------------------------------------------------------
def test_watchdog_is_fed_while_any_device_makes_progress():
    clock = Clock()
    tracker = ProgressTracker()
    card0, card1 = DeviceHealth("acc/0", clock), DeviceHealth("acc/1", clock)
    tracker.register(card0)
    tracker.register(card1)
    assert tracker.making_progress()
    card1.begin("inference", 5.0)
    clock.advance(6)
    assert [p.source for p in tracker.check()] == ["acc/1"]
    assert tracker.making_progress(), "one card hung, the other healthy: keep pinging"
    card1.abandon(card1.overdue())
    assert [str(p) for p in tracker.check()] == ["acc/1: inference running for 6.0 s (deadline 5 s)"]
    card0.unhealthy("5 inferences failed in a row")
    assert not tracker.making_progress(), "no card makes progress: let systemd restart us"
    card1.healthy()
    assert tracker.making_progress()


# -- the daemon ------------------------------------------------------------------------------------
notify = test_daemon.notify
start_daemon = test_daemon.start_daemon


def test_daemon_keeps_pinging_while_one_of_two_devices_hangs_and_recovers(tmp_path, models, media, mosquitto,
                                                                          start_daemon, notify):
    hang = tmp_path / "hang"
    config = test_daemon.base_config(tmp_path, models, mosquitto, [
        {"name": "door", "url": str(media / "indoor_people_480p_mpeg4.avi"), "loop": True, "fps": 10},
    ])
    config["accelerators"] = [{"backend": "blocking_backend:BlockingBackend", "devices": [0, 1], "batch": 1,
                               "inference_timeout_s": 2, "options": {"hang_file": str(hang), "faulty_devices": [1]}}]
    daemon, _ = start_daemon(config, watchdog_usec=1_000_000)
    sock = config["control"]["socket"]
    notify.wait_for("READY", "1", timeout=60)
    notify.wait_for("WATCHDOG", "1", timeout=10, count=2)

    hang.touch()
    wait_until(lambda: status(sock)["accelerators"][1]["state"] in ("backoff", "restarting"), 30,
               what="device 1 abandoned")
    down = status(sock)
    hung_at = time.monotonic()
    assert any(p.startswith("blockingbackend0/1: inference running for") for p in down["daemon"]["problems"]), \
        down["daemon"]
    assert down["accelerators"][0]["state"] == "running" and not down["daemon"]["healthy"]
    published_then = down["cameras"][0]["published"]
    wait_until(lambda: len([t for t, _ in notify.with_key("WATCHDOG", "1") if t > hung_at]) >= 2, 10,
               what="watchdog pings while one device is down")
    hang.unlink()
    wait_until(lambda: status(sock)["accelerators"][1]["state"] == "running", 60, what="device 1 back")
    up = status(sock)
    assert up["accelerators"][1]["restarts"] >= 1 and up["accelerators"][1]["last_error"]
    assert up["accelerators"][0]["rebalanced"] > 0 and up["cameras"][0]["rebalanced"] > 0
    assert up["cameras"][0]["published"] > published_then, "device 0 kept publishing"
    assert daemon.stop() == 0, daemon.log[-4000:]

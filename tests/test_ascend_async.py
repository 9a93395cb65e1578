"""The Ascend backend's async path, its timing, profiling, runtime report and warm-up, against the
fake pyACL in tests/fakes/acl.

`ascend.execute: async` queues the copy-in (memcpy_async), execute_async and the copy-out on the
worker's stream between four events created once at open, and waits at the last one; each input
set has its own device buffer and dataset. The fake runs a stream's tasks in order when it is
synchronised, and an event takes its timestamp from `STATE.clock` when the stream reaches it, so a
test that replaces the clock knows exactly what the events measure (no wall-clock assertions).
"""

from __future__ import annotations

import itertools
import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from device_helpers import fake_acl, make_om

acl = fake_acl()  # the strict fake (tests/fakes/acl)
pytest.importorskip("onnx")

from acl import _fake  # noqa: E402
from onnx_models import expected_scores, make_dynamic_batch_v8_model  # noqa: E402
from yoloedge.backends import acl_runtime  # noqa: E402
from yoloedge.backends.acl_observe import model_soc
from yoloedge.backends.acl_runtime import AclError  # noqa: E402
from yoloedge.backends.ascend import AscendBackend  # noqa: E402
from yoloedge.backends.base import BatchTiming  # noqa: E402
from yoloedge.config import ModelConfig  # noqa: E402
from yoloedge.config.ascend import AscendConfig  # noqa: E402
from yoloedge.pipeline.detector import Detector  # noqa: E402
from yoloedge.pipeline.workerreport import runtime_problems  # noqa: E402
from yoloedge.pipeline.workerstats import WorkerStats  # noqa: E402
from yoloedge.web.metrics import device_metrics  # noqa: E402

SIZE = 64
GEARS = [1, 2, 4, 8]


@pytest.fixture(autouse=True)
def fake_process(monkeypatch):
    state = _fake.reset()
    monkeypatch.setattr(acl_runtime, "PROCESS", acl_runtime.AclProcess())
    yield state


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory) -> Path:
    return make_dynamic_batch_v8_model(tmp_path_factory.mktemp("tiny") / "tiny_dynamic.onnx", size=SIZE)


@pytest.fixture
def tiny_om(tmp_path, tiny_onnx) -> Path:
    return make_om(tmp_path, tiny_onnx, "tiny.om", batch=GEARS)


def fresh_process(monkeypatch) -> _fake.State:
    """A new fake process (pyACL allows one acl.init per process)."""
    state = _fake.reset()
    monkeypatch.setattr(acl_runtime, "PROCESS", acl_runtime.AclProcess())
    return state


def opened(om: Path, max_batch: int = 1, input_sets: int = 1, **config) -> AscendBackend:
    backend = AscendBackend(str(om), AscendConfig(**config))
    backend.open(max_batch, input_sets=input_sets)
    return backend


def class_scores(out: np.ndarray) -> np.ndarray:
    return np.stack([out[:, 4, 0], out[:, 5, (SIZE // 8) ** 2]], axis=1)


def fill(backend: AscendBackend, input_set: int, seed: int) -> np.ndarray:
    buf = backend.input_buffers[input_set]
    buf[...] = np.random.default_rng(seed).random(buf.shape, dtype=np.float32)
    return buf


# -- the async path ----------------------------------------------------------------------------------
def test_async_queues_copies_and_execution_between_events_created_once(tiny_om):
    backend = opened(tiny_om, max_batch=4, input_sets=2, execute="async")
    try:
        state = _fake.STATE
        assert state.counts["acl.rt.create_event"] == 4 and len(state.events) == 4
        # one device buffer and one dataset per input set
        assert len(set(backend._input.device_ptrs)) == 2 and len(set(backend._input_datasets)) == 2
        bufs = [fill(backend, s, seed) for s, seed in ((0, 1), (1, 2))]
        for _ in range(3):
            for s in (0, 1):
                out = backend.run(3, input_set=s)
                np.testing.assert_allclose(class_scores(out[0]), expected_scores(bufs[s][:3]), rtol=1e-5)
        assert state.counts["acl.rt.create_event"] == 4  # never per batch
        assert state.counts["acl.rt.memcpy_async"] == 6 * 2  # one in, one out (one output) per batch
        assert state.counts["acl.rt.record_event"] == 6 * 4
        assert state.counts["acl.rt.synchronize_event"] == 6
        assert state.counts["acl.mdl.execute_async"] == 6 and not state.counts["acl.rt.synchronize_stream"]
        assert not state.refusals
    finally:
        backend.close()
    assert _fake.leaks()["events"] == 0 and not any(_fake.leaks().values())


def test_async_and_sync_give_the_same_outputs_from_each_sets_own_device_buffer(tiny_om, monkeypatch):
    results = {}
    for mode in ("sync", "async"):
        fresh_process(monkeypatch)
        backend = opened(tiny_om, max_batch=8, input_sets=3, execute=mode)
        try:
            rows = []
            for s in range(3):
                fill(backend, s, 10 + s)
            for s, n in ((0, 5), (2, 1), (1, 8), (0, 2)):
                rows.append(class_scores(backend.run(n, input_set=s)[0]).copy())
            results[mode] = rows
            assert _fake.STATE.executed_gears == [8, 1, 8, 2]
            assert (_fake.STATE.counts["acl.rt.create_event"] == 4) == (mode == "async")
        finally:
            backend.close()
    for a, b in zip(results["sync"], results["async"]):
        np.testing.assert_array_equal(a, b)


def test_the_events_time_each_step_on_the_device(tiny_om, fake_process):
    ticks = itertools.count()
    fake_process.clock = lambda: next(ticks) * 0.002  # each event the stream reaches: 2 ms later
    backend = opened(tiny_om, max_batch=2, execute="async")
    try:
        fill(backend, 0, 3)
        assert backend.last_timing() is None  # nothing ran yet
        backend.run(2)
        timing = backend.last_timing()
        assert timing is not None and timing.source == "events"
        assert timing.copy_in_s == pytest.approx(0.002)
        assert timing.execute_s == pytest.approx(0.002)
        assert timing.copy_out_s == pytest.approx(0.002)
    finally:
        backend.close()


def test_sync_times_each_step_with_the_host_clock(tiny_om):
    backend = opened(tiny_om, max_batch=2)
    try:
        backend.run(1)
        timing = backend.last_timing()
        assert timing is not None and timing.source == "host"
        assert min(timing.copy_in_s, timing.execute_s, timing.copy_out_s) >= 0
    finally:
        backend.close()


def test_an_execution_error_surfaces_at_the_last_event_and_the_next_batch_runs(tiny_om):
    backend = opened(tiny_om, max_batch=2, execute="async")
    try:
        _fake.fail("acl.mdl.execute_async", 507011, times=1)
        with pytest.raises(AclError, match=r"acl\.rt\.synchronize_event failed with 507011"):
            backend.run(2)
        buf = fill(backend, 0, 4)
        np.testing.assert_allclose(class_scores(backend.run(2)[0]), expected_scores(buf[:2]), rtol=1e-5)
    finally:
        backend.close()


def test_async_with_staged_views_copies_synchronously(tiny_om, monkeypatch):
    real = acl.util.ptr_to_numpy
    monkeypatch.setattr(acl.util, "ptr_to_numpy", lambda p, s, t: real(p, s, t).copy())
    backend = opened(tiny_om, max_batch=4, execute="async")
    try:
        assert backend._input.hosts[0].staged and not backend._events
        buf = fill(backend, 0, 5)
        np.testing.assert_allclose(class_scores(backend.run(3)[0]), expected_scores(buf[:3]), rtol=1e-5)
        timing = backend.last_timing()
        assert timing is not None and timing.copy_in_s is None and timing.copy_out_s is None
        assert _fake.STATE.counts["acl.rt.synchronize_stream"] == 1
    finally:
        backend.close()


def test_memory_counts_one_device_input_buffer_per_set(tiny_om):
    before = _fake.STATE.allocated("device")
    backend = opened(tiny_om, max_batch=8, input_sets=3)
    try:
        assert backend.memory()["device_bytes"] == _fake.STATE.allocated("device") - before
    finally:
        backend.close()


# -- the fake's events --------------------------------------------------------------------------------
def test_the_fake_refuses_misused_events(fake_process):
    assert acl.init() == 0
    assert acl.rt.set_device(0) == 0
    stream, _ = acl.rt.create_stream()
    start, ret = acl.rt.create_event()
    end, _ = acl.rt.create_event()
    assert ret == 0 and start and end != start
    assert acl.rt.record_event(start, stream) == 0 and acl.rt.record_event(end, stream) == 0
    assert acl.rt.event_elapsed_time(start, end) == (0.0, 107000)  # the stream has not reached them
    assert acl.rt.synchronize_event(end) == 0
    ms, ret = acl.rt.event_elapsed_time(start, end)
    assert ret == 0 and isinstance(ms, float) and ms >= 0
    assert acl.finalize() == 500001  # events (and the stream) still held
    assert fake_process.finalize_refused[-1]["events"] == 2
    assert acl.rt.destroy_event(start) == 0 and acl.rt.destroy_event(start) == 107000
    assert acl.rt.destroy_event(end) == 0 and acl.rt.destroy_stream(stream) == 0
    with pytest.raises(TypeError):
        acl.rt.record_event(np.int64(end), stream)
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0


# -- profiling ---------------------------------------------------------------------------------------
def test_profile_wraps_a_bounded_number_of_batches(tiny_om, tmp_path, fake_process, caplog):
    caplog.set_level(logging.INFO, logger="yoloedge")
    folder = tmp_path / "prof"
    backend = opened(tiny_om, max_batch=2, profile=str(folder), profile_batches=3)
    try:
        calls = [c[0] for c in fake_process.prof]
        assert calls == ["init", "create_config", "start"]
        assert fake_process.prof[1] == ("create_config", [0], 0, 0x7)
        for _ in range(5):
            backend.run(1)
        calls = [c[0] for c in fake_process.prof]
        assert calls == ["init", "create_config", "start", "stop", "destroy_config", "finalize"]
        assert (folder / "fake-msprof.json").is_file()
        assert str(folder) in caplog.text
    finally:
        backend.close()
    assert len(fake_process.prof) == 6  # close after the profiler stopped does nothing more


def test_close_stops_a_profile_not_yet_complete_and_one_session_per_process(tiny_om, tmp_path, fake_process):
    first = opened(tiny_om, max_batch=2, profile=str(tmp_path / "a"), profile_batches=100)
    second = opened(tiny_om, max_batch=2, profile=str(tmp_path / "b"))  # not profiled: one at a time
    try:
        second.run(1)
        first.run(1)
    finally:
        second.close()
        first.close()
    assert [c[0] for c in fake_process.prof] == ["init", "create_config", "start", "stop",
                                                 "destroy_config", "finalize"]
    assert not (tmp_path / "b" / "fake-msprof.json").exists()


# -- the runtime: CANN version and SoC ----------------------------------------------------------------
def om_converted_for(om: Path, soc: str) -> Path:
    """The fake .om's bytes as ATC records the chip: a "soc_version" attribute, then its string
    (the fake writes nothing into the file; the pairing's ONNX decides what runs)."""
    om.write_bytes(b"\x00" * 5000 + b"\x0a\x0bsoc_version\x12\x0d\x12\x0b" + soc.encode() + b"\x00" * 100)
    return om


def test_status_shows_cann_and_soc_and_warns_on_an_om_for_another_chip(tiny_om, caplog):
    om_converted_for(tiny_om, "Ascend310")
    backend = opened(tiny_om, max_batch=2)
    try:
        info = backend.runtime_info()
        assert info["cann"] == "8.0.0" and info["soc"] == "Ascend310P3" and info["model_soc"] == "Ascend310"
        assert len(info["problems"]) == 1 and "--soc_version=Ascend310P3" in info["problems"][0]
        assert "converted for Ascend310" in caplog.text
        assert "CANN 8.0.0 Ascend310P3" in backend.description
    finally:
        backend.close()
    assert backend.runtime_info() is None


def test_an_om_for_this_chip_or_without_the_attribute_is_no_problem(tiny_om, monkeypatch):
    backend = opened(tiny_om, max_batch=1)  # the fake .om names no chip
    try:
        assert backend.runtime_info()["model_soc"] is None and backend.runtime_info()["problems"] == []
    finally:
        backend.close()
    om_converted_for(tiny_om, "Ascend310P3")
    fresh_process(monkeypatch)
    backend = opened(tiny_om, max_batch=1)
    try:
        assert backend.runtime_info()["problems"] == []
    finally:
        backend.close()


def test_model_soc_finds_the_attribute_across_chunks_and_within_its_bound(tmp_path):
    path = tmp_path / "m.om"
    path.write_bytes(b"x" * ((1 << 20) - 6) + b"soc_version\x12\x0bAscend910B")
    assert model_soc(str(path)) == "Ascend910B"
    assert model_soc(str(path), limit=1 << 19) is None
    assert model_soc(str(tmp_path / "missing.om")) is None


# -- warm-up -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_batch, gears", [(8, [1, 2, 4, 8]), (5, [1, 2, 4, 8]), (1, [1])])
def test_warm_up_runs_every_batch_gear(tiny_om, fake_process, max_batch, gears):
    backend = AscendBackend(str(tiny_om), AscendConfig())
    detector = Detector(ModelConfig(path=str(tiny_om), format="v8"), backend, max_batch=max_batch)
    try:
        detector.warm_up()
        assert fake_process.executed_gears == gears
    finally:
        backend.close()


def test_warm_up_batches_name_one_size_per_gear(tiny_om, tmp_path, tiny_onnx, monkeypatch):
    backend = opened(tiny_om, max_batch=6)
    try:
        assert backend.warm_up_batches == (1, 2, 4, 6)  # 6 frames run on gear 8
    finally:
        backend.close()
    fresh_process(monkeypatch)
    backend = opened(make_om(tmp_path, tiny_onnx, "fixed.om", batch=4), max_batch=4)
    try:
        assert backend.warm_up_batches == (1,)  # a fixed batch: one run, as every backend does
    finally:
        backend.close()


# -- status and /metrics ------------------------------------------------------------------------------
def test_worker_stats_and_metrics_split_each_batch():
    stats = WorkerStats.for_batch(4)
    stats.inferred(4, 0.010, BatchTiming(0.002, 0.007, 0.001, "events"))
    stats.inferred(2, 0.010, None)  # a backend that does not time the steps
    stats.inferred(2, 0.010, BatchTiming(None, 0.010, None))
    meters = stats.meters()
    assert meters["copy_in_p50_ms"] == pytest.approx(2.0) and meters["copy_out_p50_ms"] == pytest.approx(1.0)
    assert meters["execute_p50_ms"] is not None
    worker = SimpleNamespace(device=0, stats=stats)
    idle = SimpleNamespace(device=1, stats=WorkerStats.for_batch(4))
    families = {f.name: f for f in device_metrics([], [("npu", worker), ("npu", idle)])}
    counts = {}
    for step in ("copy_in", "execute", "copy_out"):
        family = families[f"yoloedge_device_{step}_seconds"]
        counts[step] = [s.value for s in family.samples if s.name.endswith("_count")]
        assert all(s.labels["device"] == "0" for s in family.samples)  # no series for a device never timed
    assert counts == {"copy_in": [1], "execute": [2], "copy_out": [1]}


def test_a_worker_reports_its_models_runtime_problems_once(tiny_om):
    om_converted_for(tiny_om, "Ascend910B")
    first, second = opened(tiny_om), opened(tiny_om)  # two models of one card, the same mismatch
    try:
        models = [SimpleNamespace(detector=SimpleNamespace(backend=b)) for b in (first, second)]
        done = threading.Event()
        worker = SimpleNamespace(incarnation=SimpleNamespace(done=done, models=models))
        (problem,) = runtime_problems(worker)
        assert "converted for Ascend910B" in problem and "device 0 is Ascend310P3" in problem
        done.set()  # an incarnation that ended reports nothing
        assert runtime_problems(worker) == []
    finally:
        second.close()
        first.close()


# -- two batches in flight (submit / complete) ---------------------------------------------------------
def test_two_batches_in_flight_each_with_its_own_output_buffers_and_events(tiny_om, fake_process):
    ticks = itertools.count()
    fake_process.clock = lambda: next(ticks) * 0.001
    backend = AscendBackend(str(tiny_om), AscendConfig(execute="async"))
    backend.open(4, input_sets=2, output_sets=2)
    try:
        assert backend.pipelined
        assert fake_process.counts["acl.rt.create_event"] == 8  # 4 per output set, once
        assert all(len(set(o.device_ptrs)) == 2 for o in backend._outputs)
        assert backend.memory()["device_bytes"] > 0
        bufs = [fill(backend, s, 20 + s) for s in (0, 1)]
        first = backend.submit(3, input_set=0, output_set=0)
        second = backend.submit(2, input_set=1, output_set=1)  # queued behind the first
        first_end = fake_process.events[backend._event_sets[0].events[3]]
        second_end = fake_process.events[backend._event_sets[1].events[3]]
        assert first_end.stamp is None and second_end.stamp is None  # nothing ran at submit
        out0 = backend.complete(first)
        assert first_end.stamp is not None and second_end.stamp is None  # only the first waited for
        timing0 = backend.last_timing()
        out1 = backend.complete(second)
        timing1 = backend.last_timing()
        np.testing.assert_allclose(class_scores(out0[0]), expected_scores(bufs[0][:3]), rtol=1e-5)
        np.testing.assert_allclose(class_scores(out1[0]), expected_scores(bufs[1][:2]), rtol=1e-5)
        assert timing0 is not None and timing1 is not None and timing0 is not timing1
        assert timing0.source == timing1.source == "events"
        assert timing1.copy_in_s == pytest.approx(0.001)  # each ticket's own events
        # the same as one batch after the other, and as sync
        same = [class_scores(backend.run(n, input_set=s, output_set=s)[0]) for s, n in ((0, 3), (1, 2))]
        np.testing.assert_array_equal(same[0], class_scores(out0[0]))
    finally:
        backend.close()
    assert not any(_fake.leaks().values()), _fake.leaks()


def test_a_failed_execution_surfaces_at_its_own_complete_and_the_next_batch_completes(tiny_om):
    backend = AscendBackend(str(tiny_om), AscendConfig(execute="async"))
    backend.open(2, input_sets=2, output_sets=2)
    try:
        buf = fill(backend, 1, 7)
        _fake.fail("acl.mdl.execute_async", 507011, times=1)
        failing = backend.submit(2, input_set=0, output_set=0)
        good = backend.submit(2, input_set=1, output_set=1)
        with pytest.raises(AclError, match=r"acl\.rt\.synchronize_event failed with 507011"):
            backend.complete(failing)
        np.testing.assert_allclose(class_scores(backend.complete(good)[0]), expected_scores(buf[:2]), rtol=1e-5)
    finally:
        backend.close()
    assert not any(_fake.leaks().values())


def test_close_waits_for_a_batch_submitted_and_never_completed(tiny_om, fake_process):
    backend = AscendBackend(str(tiny_om), AscendConfig(execute="async"))
    backend.open(2, output_sets=2)
    backend.submit(1, output_set=1)
    backend.close()
    assert fake_process.counts["acl.rt.synchronize_stream"] == 1
    assert not any(_fake.leaks().values()), _fake.leaks()


def test_sync_and_other_backends_do_not_pipeline_and_submit_runs_at_once(tiny_om, fake_process):
    backend = opened(tiny_om, max_batch=2)
    try:
        assert not backend.pipelined
        buf = fill(backend, 0, 8)
        ticket = backend.submit(2)
        assert fake_process.counts["acl.mdl.execute"] == 1  # ran at submit
        np.testing.assert_allclose(class_scores(backend.complete(ticket)[0]), expected_scores(buf[:2]), rtol=1e-5)
    finally:
        backend.close()

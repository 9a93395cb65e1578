"""The device worker with a pipelining backend (Ascend `execute: async` on the fake pyACL): it
submits the next batch before it completes the one in flight, publishes per ticket, and the
recovery paths (a failing execution surfacing at `complete`, a hung `complete`) still hold, with
nothing leaked at finalize. Reuses test_recovery's rig (batcher, preparers, two workers, post)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import test_recovery  # puts the fakes first on sys.path
from test_recovery import CAMERAS, Rig, exercise

import acl  # noqa: E402  (the fake)
from yoloedge.backends.ascend import AscendBackend  # noqa: E402
from yoloedge.config.ascend import AscendConfig  # noqa: E402
from onnx_models import make_dynamic_batch_v8_model  # noqa: E402
from yoloedge.backends import acl_runtime  # noqa: E402


@pytest.fixture()
def fake_acl(monkeypatch):
    if not hasattr(acl, "_fake"):
        pytest.skip("the real pyACL is imported in this process; this test needs the fake")
    state = acl._fake.reset()
    monkeypatch.setattr(acl_runtime, "PROCESS", acl_runtime.AclProcess())
    return state


@pytest.fixture()
def tiny_om(tmp_path) -> Path:
    """A fake .om of a dynamic-batch model (gears 1 and 2), as test_recovery's."""
    onnx_path = make_dynamic_batch_v8_model(str(tmp_path / "tiny.onnx"), size=test_recovery.SIZE, nc=2)
    om = tmp_path / "tiny.om"
    om.write_bytes(b"fake om: see the .fake.json next to it")
    Path(f"{om}.fake.json").write_text(json.dumps({"onnx": str(onnx_path), "batch": [1, 2]}))
    return om


class Spy(AscendBackend):
    """Records the order of submits and completes: (what, output set)."""

    calls: list[tuple[str, int]]
    lock = threading.Lock()

    def submit(self, n, input_set=0, output_set=0):
        ticket = super().submit(n, input_set, output_set)
        with self.lock:
            self.calls.append(("submit", ticket.output_set))
        return ticket

    def complete(self, ticket):
        with self.lock:
            self.calls.append(("complete", ticket.output_set))
        return super().complete(ticket)


def spies(om, devices=(0, 1)):
    made: list[Spy] = []

    def factory(d):
        spy = Spy(str(om), AscendConfig(device_id=d, execute="async"))
        spy.calls = []
        made.append(spy)
        return spy
    return made, [lambda d=d: factory(d) for d in devices]


def test_the_next_batch_is_submitted_before_the_one_in_flight_completes(fake_acl, tiny_om):
    made, factories = spies(tiny_om, (0,))
    rig = Rig(str(tiny_om), factories)
    try:
        spy = made[0]
        assert spy.pipelined
        rig.feed(40)
        rig.settle("served")
        assert rig.lost == 0 and len(rig.sink) == rig.fed
        calls = list(spy.calls)
        in_flight = depth = 0
        for what, _ in calls:
            in_flight += 1 if what == "submit" else -1
            depth = max(depth, in_flight)
            assert 0 <= in_flight <= 2
        assert depth == 2, "no batch was ever submitted while another was in flight"
        overlapped = [i for i, (what, _) in enumerate(calls[:-1]) if what == "submit" and calls[i + 1][0] == "complete"
                      and i > 0 and calls[i - 1][0] == "submit"]
        assert overlapped, calls
        # the two batches in flight use different output sets (their own device buffers and events)
        open_sets: list[int] = []
        for what, out in calls:
            if what == "submit":
                assert out not in open_sets
                open_sets.append(out)
            else:
                assert open_sets.pop(0) == out  # completed in submission order
        for camera in CAMERAS:  # published in order, each once
            seqs = [s for c, s, _ in rig.sink.snapshot() if c == camera]
            assert seqs == sorted(set(seqs)) and seqs
    finally:
        rig.stop()
    assert not any(acl._fake.leaks().values()), acl._fake.leaks()


def test_a_pipelined_card_recovers_from_errors_at_complete_and_a_hung_complete(fake_acl, tiny_om):
    from acl import _fake

    made, factories = spies(tiny_om)
    rig = Rig(str(tiny_om), factories)
    holds = []

    def hang():
        holds.append(_fake.hold("acl.rt.synchronize_event", device=1))
        return holds[-1].entered

    try:
        # execute_async fails on the stream: the error comes back at complete (synchronize_event)
        exercise(rig, lambda: _fake.fail("acl.mdl.execute_async", 507011, device=1, times=2), hang,
                 lambda: holds[-1].release(), leaks=_fake.leaks)
        assert any(("acl.mdl.execute_async (on the stream)", 507011) == e for e in _fake.STATE.errors)
    finally:
        for h in holds:
            h.release()
        rig.stop()
    assert not any(_fake.leaks().values()), _fake.leaks()
    assert _fake.STATE.finalize_count == 1 and not _fake.STATE.finalize_refused


@pytest.mark.parametrize("execute", ["sync", "async"])
def test_only_async_pinned_backends_pipeline(fake_acl, tiny_om, execute):
    backend = AscendBackend(str(tiny_om), AscendConfig(execute=execute))
    try:
        assert not backend.pipelined  # not before open
        backend.open(2, input_sets=2, output_sets=2)
        assert backend.pipelined == (execute == "async")
    finally:
        backend.close()


def test_the_default_submit_runs_at_once_and_complete_hands_over_its_outputs():
    import numpy as np

    from yoloedge.backends.base import Backend, Ticket
    from yoloedge.errors import BackendError

    class Plain(Backend):
        runs: list[tuple[int, int, int]] = []

        def open(self, max_batch, input_hw=None, *, input_sets=1, output_sets=1):
            raise NotImplementedError

        input_buffers = ()  # type: ignore[assignment]
        max_batch = 4  # type: ignore[assignment]

        def run(self, n, input_set=0, output_set=0):
            self.runs.append((n, input_set, output_set))
            return [np.full((n, 2), output_set)]

        def close(self):
            pass

    backend = Plain("m")
    assert not backend.pipelined
    ticket = backend.submit(3, 1, 2)
    assert backend.runs == [(3, 1, 2)]  # ran at submit
    (out,) = backend.complete(ticket)
    assert out.shape == (3, 2) and (out == 2).all()
    with pytest.raises(BackendError, match="did not hand out"):
        backend.complete(Ticket(1, 0, 0))

"""The drain's token bucket and the record of spool messages sent ahead of it, on a clock the test
moves (no wall-clock rates)."""

from __future__ import annotations

import pytest

from yoloedge.publish.pacing import UNLIMITED, SentAhead, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def test_the_bucket_allows_its_burst_then_its_rate_and_never_saves_up_more():
    clock = Clock()
    bucket = TokenBucket(rate=20, burst=20, clock=clock)
    assert bucket.available() == 20
    bucket.take(20)
    assert bucket.available() == 0 and bucket.wait_s(2) == pytest.approx(0.1)
    clock.now += 0.25
    assert bucket.available() == 5
    bucket.take(5)
    clock.now += 3600  # an hour away: still only one burst
    assert bucket.available() == 20
    assert bucket.step() == 2 and bucket.wait_s(2) == 0


def test_a_slow_rate_waits_for_single_messages_and_zero_is_unlimited():
    clock = Clock()
    slow = TokenBucket(rate=0.5, burst=1, clock=clock)
    slow.take(slow.available())
    assert slow.step() == 1 and slow.wait_s(1) == pytest.approx(2.0)
    clock.now += 2
    assert slow.available() == 1
    free = TokenBucket(rate=0, burst=1, clock=clock)
    free.take(10**6)
    assert free.unlimited and free.available() == UNLIMITED and free.wait_s(10) == 0


def test_messages_granted_before_the_clock_moved_are_charged_to_that_grant():
    """The drain asks what it may send, sends it, then takes it; the clock may move in between
    (the publisher's clock is its own). The next second's burst stays whole."""
    clock = Clock()
    bucket = TokenBucket(rate=10, burst=10, clock=clock)
    bucket.take(9)
    assert bucket.available() == 1  # the grant
    clock.now += 3600  # moves while that one message is handed over
    bucket.take(1)
    assert bucket.available() == 10


def test_a_bad_bucket_is_refused():
    with pytest.raises(ValueError):
        TokenBucket(rate=-1, burst=1, clock=Clock())
    with pytest.raises(ValueError):
        TokenBucket(rate=1, burst=0, clock=Clock())


def test_sent_ahead_keeps_ranges_and_forgets_what_the_drain_passed():
    ahead = SentAhead()
    for seq in range(100, 200):  # live messages while a backlog below 100 drains
        ahead.add(seq)
    ahead.add(40)  # the newest retained state, sent at the reconnect
    ahead.add(42)
    ahead.add(41)  # joins both neighbours
    ahead.add(150)  # already in
    assert len(ahead) == 2
    assert [seq for seq in range(0, 210, 1) if ahead.passed(seq)] == [40, 41, 42, *range(100, 200)]
    assert len(ahead) == 0, "everything the drain passed is forgotten"
    ahead.add(5)
    ahead.clear()
    assert not ahead.passed(5)

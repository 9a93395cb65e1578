"""The frame buffers the cameras share (sources/framepool.py): never waits, reuses, keeps few idle.

No I/O and no clock: the pool's windows count takes, so every case is exact.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from yoloedge.sources.framepool import FramePool

FULL_HD = (1080, 1920, 3)
SMALL = (48, 64, 3)


def test_a_buffer_given_back_is_the_next_one_taken():
    pool = FramePool()
    first = pool.take(SMALL)
    pool.give(first)
    again = pool.take(SMALL)
    assert again is first
    assert again.shape == SMALL and again.dtype == np.uint8
    assert pool.allocated == 1


def test_taking_never_waits_for_a_buffer_in_use_it_makes_another():
    """Readers blocked on full lossless queues hold their buffers; the others still get one at once."""
    pool = FramePool()
    held = [pool.take(SMALL) for _ in range(5)]  # nobody gives anything back
    got: list[np.ndarray] = []
    taker = threading.Thread(target=lambda: got.append(pool.take(SMALL)), daemon=True)
    taker.start()
    taker.join(10)
    assert not taker.is_alive() and len(got) == 1
    buffers = held + got
    assert len({b.ctypes.data for b in buffers}) == 6  # six distinct buffers, none shared
    assert pool.allocated == 6 and pool.in_use() == 6 and pool.idle() == 0


def test_idle_buffers_are_at_most_the_peak_in_use_and_a_burst_is_let_go_after_two_windows():
    pool = FramePool(window_takes=4)
    burst = [pool.take(SMALL) for _ in range(3)]  # three cameras at once: the window's 3rd take
    for buffer in burst:
        pool.give(buffer)
    assert pool.idle(SMALL) == 3  # the peak: kept for the next burst
    for _ in range(8):  # from now on one camera at a time: two more windows
        pool.give(pool.take(SMALL))
    assert pool.idle(SMALL) == 1
    assert pool.allocated == 3 and pool.let_go == 2


def test_more_buffers_given_back_than_the_peak_allows_are_let_go():
    pool = FramePool(window_takes=2)
    a, b = pool.take(SMALL), pool.take(SMALL)  # peak 2 in the window that ends here
    c = pool.take(SMALL)  # the next window: peak 1 so far (a, b still out: 3 in use)
    for buffer in (a, b, c):
        pool.give(buffer)
    assert pool.idle(SMALL) == 3  # the previous window's peak was 2, this one's 3
    pool.give(pool.take(SMALL))  # ends the window: the previous peak is now 3
    pool.give(pool.take(SMALL))
    pool.give(pool.take(SMALL))  # ends the next: peaks of 1 only, one buffer kept
    assert pool.idle(SMALL) == 1


def test_a_shape_no_camera_asks_for_any_more_is_let_go():
    """A camera that changed its resolution, or was removed: its size's buffers do not stay."""
    pool = FramePool(window_takes=4)
    pool.give(pool.take(FULL_HD))
    assert pool.idle(FULL_HD) == 1
    for _ in range(8):
        pool.give(pool.take(SMALL))
    assert pool.idle(FULL_HD) == 0 and pool.idle(SMALL) == 1
    assert pool.idle_bytes() == 48 * 64 * 3


def test_clear_lets_every_idle_buffer_go_and_buffers_in_use_still_come_back():
    pool = FramePool()
    out = pool.take(SMALL)
    pool.give(pool.take(SMALL))  # now one idle (the peak was 2)
    pool.give(pool.take(FULL_HD))
    assert pool.clear() == 2
    assert pool.idle() == 0 and pool.in_use() == 1
    pool.give(out)
    assert pool.in_use() == 0 and pool.idle() <= 1


def test_a_buffer_the_pool_did_not_lend_is_not_kept():
    pool = FramePool()
    pool.give(np.empty(SMALL, np.uint8))
    assert pool.idle() == 0 and pool.in_use() == 0


def test_many_readers_at_once_share_a_few_buffers_and_return_them_all():
    pool = FramePool(window_takes=64)
    readers, rounds = 8, 300
    start = threading.Barrier(readers)
    errors: list[str] = []

    def reader(mark: int) -> None:
        start.wait()
        for _ in range(rounds):
            buffer = pool.take(SMALL)
            buffer[0, 0, 0] = mark  # nobody else writes this buffer while it is lent to us
            if buffer[0, 0, 0] != mark:
                errors.append("a lent buffer was written by another reader")
            pool.give(buffer)

    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(readers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    assert pool.in_use() == 0
    assert 1 <= pool.allocated <= readers  # never more than were out at once
    assert pool.idle() <= readers


def test_window_of_no_takes_is_refused():
    with pytest.raises(ValueError):
        FramePool(window_takes=0)

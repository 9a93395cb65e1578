"""Full frames kept for event best shots (routing.keeper): only while wanted, bounded, reused."""

from __future__ import annotations

import numpy as np

from yoloedge.routing.keeper import FREE_AFTER_S, FrameKeeper
from yoloedge.sources.frame import Frame


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def frame(seq: int, image: np.ndarray) -> Frame:
    image[:] = seq
    return Frame("gate", seq, image, 1.7e9 + seq, float(seq))


def test_frames_are_kept_only_while_wanted_into_buffers_allocated_once():
    clock = Clock()
    keeper = FrameKeeper(depth=2, clock=clock)
    taken: list[int] = []
    sink = keeper.tap("gate", lambda f, timeout: taken.append(f.seq) or True)
    pooled = np.zeros((4, 6, 3), np.uint8)  # the reader's buffer, overwritten by every read
    keeper.want("gate", True, False)  # its first frames had nothing in view
    assert sink(frame(0, pooled), 1.0)
    assert keeper.find("gate", 0, 0.0) is None  # not wanted: nothing copied
    keeper.want("gate", True, True)
    for seq in range(1, 4):
        sink(frame(seq, pooled), 1.0)
    assert taken == [0, 1, 2, 3]
    one, two = keeper.find("gate", 1, 1.0), keeper.find("gate", 2, 2.0)
    assert one is not None and two is not None and one[0, 0, 0] == 1 and two[0, 0, 0] == 2
    assert keeper.find("gate", 3, 3.0) is None  # both buffers held by frames in flight: missed
    keeper.done("gate", 2.0)  # frame 2 routed: it and every older one go
    for seq in range(4, 40):
        sink(frame(seq, pooled), 1.0)
        keeper.done("gate", float(seq))
    stats = keeper.stats("gate")
    assert stats["frames_missed"] == 1 and stats["frames_kept"] == 2 + 36
    assert keeper._cameras["gate"].allocations == 2  # never per frame
    keeper.want("gate", True, False)
    sink(frame(40, pooled), 1.0)
    clock.t += FREE_AFTER_S
    sink(frame(41, pooled), 1.0)
    assert keeper.stats("gate")["bytes"] == 0  # nobody in view for a while: the buffers go


def test_a_frame_of_another_size_gets_a_buffer_of_its_size():
    keeper = FrameKeeper(depth=1)
    keeper.add("gate")
    keeper.want("gate", True, True)
    keeper.offer(frame(0, np.zeros((4, 6, 3), np.uint8)))
    keeper.done("gate", 0.0)
    keeper.offer(frame(1, np.zeros((8, 12, 3), np.uint8)))
    kept = keeper.find("gate", 1, 1.0)
    assert kept is not None and kept.shape == (8, 12, 3)


def test_a_large_frame_is_kept_scaled_to_fit_960_pixels_and_a_small_one_as_it_is():
    keeper = FrameKeeper(depth=1)
    sink = keeper.tap("gate", lambda f, timeout: True)
    big = np.zeros((1080, 1920, 3), np.uint8)
    big[:, 960:] = 200  # the right half bright: still the right half when scaled
    sink(Frame("gate", 0, big, 1.7e9, 0.0), 1.0)
    kept = keeper.find("gate", 0, 0.0)
    assert kept is not None and kept.shape == (540, 960, 3)
    assert kept[:, :470].max() == 0 and kept[:, 490:].min() == 200
    keeper.done("gate", 0.0)
    portrait = np.full((1920, 1080), 7, np.uint8)  # the long side decides, grey stays grey
    sink(Frame("gate", 1, portrait, 1.7e9 + 1, 1.0), 1.0)
    kept = keeper.find("gate", 1, 1.0)
    assert kept is not None and kept.shape == (960, 540) and kept.min() == kept.max() == 7
    keeper.done("gate", 1.0)
    small = np.full((480, 640, 3), 9, np.uint8)
    sink(Frame("gate", 2, small, 1.7e9 + 2, 2.0), 1.0)
    kept = keeper.find("gate", 2, 2.0)
    assert kept is not None and kept.shape == small.shape and (kept == small).all()


def test_a_lossless_camera_waits_slice_by_slice_for_a_buffer_and_keeps_each_frame_once():
    keeper = FrameKeeper(depth=1)
    answers = [False, True, True]  # the intake refuses the first slice of frame 0 (queue full)
    taken: list[int] = []

    def intake(f: Frame, timeout: float) -> bool:
        taken.append(f.seq)
        return answers.pop(0)

    sink = keeper.tap("gate", intake, wait=True)
    pooled = np.zeros((4, 6, 3), np.uint8)
    assert not sink(frame(0, pooled), 0.01) and sink(frame(0, pooled), 0.01)  # offered twice, kept once
    assert keeper.stats("gate")["frames_kept"] == 1
    # the one buffer is held by frame 0 in flight: frame 1 is not handed on yet, and not missed
    assert not sink(frame(1, pooled), 0.01) and not sink(frame(1, pooled), 0.01)
    assert taken == [0, 0] and keeper.stats("gate")["frames_missed"] == 0
    keeper.done("gate", 0.0)  # frame 0 routed: the next slice finds its buffer
    assert sink(frame(1, pooled), 0.01) and taken == [0, 0, 1]
    kept = keeper.find("gate", 1, 1.0)
    assert kept is not None and kept[0, 0, 0] == 1
    assert keeper.stats("gate") == {"frames_kept": 2, "frames_missed": 0, "bytes": pooled.nbytes}


def test_a_lossless_camera_is_kept_with_nothing_in_view_and_not_without_snapshots():
    keeper = FrameKeeper(depth=2)
    keeper.add("file", wait=True)
    keeper.add("live")
    for camera in ("file", "live"):
        keeper.want(camera, True, False)  # snapshots on, nobody in view in the last routed frame
    pooled = np.zeros((4, 6, 3), np.uint8)
    for camera in ("file", "live"):
        keeper.offer(Frame(camera, 0, pooled, 1.7e9, 0.0))
    assert keeper.find("file", 0, 0.0) is not None  # its reader runs ahead: the next frames may matter
    assert keeper.find("live", 0, 0.0) is None
    keeper.want("file", False, True)  # its events take no snapshots
    keeper.offer(Frame("file", 1, pooled, 1.7e9 + 1, 1.0))
    assert keeper.find("file", 1, 1.0) is None


def test_a_frame_of_a_camera_with_two_models_goes_once_both_are_done_with_it():
    keeper = FrameKeeper(depth=3)
    sink = keeper.tap("gate", lambda f, timeout: True)
    keeper.models("gate", ("coco", "faces"))
    pooled = np.zeros((4, 6, 3), np.uint8)
    for seq in range(3):
        sink(frame(seq, pooled), 0.0)
    keeper.done("gate", 2.0, "coco")  # the fast model is through frame 2
    assert all(keeper.find("gate", seq, float(seq)) is not None for seq in range(3)), "faces still needs them"
    keeper.done("gate", 0.0, "faces")
    assert keeper.find("gate", 0, 0.0) is None  # both done with frame 0
    kept = keeper.find("gate", 1, 1.0)
    assert kept is not None and kept[0, 0, 0] == 1  # its own picture, not overwritten
    keeper.done("gate", 2.0, "coco")  # done twice by one model: still waits for the other
    assert keeper.find("gate", 1, 1.0) is not None
    keeper.done("gate", 2.0, "faces")  # faces dropped frame 1 on its way: frame 2 lets it go too
    assert all(keeper.find("gate", seq, float(seq)) is None for seq in range(3))
    assert keeper.stats("gate")["frames_missed"] == 0


def test_a_lossless_camera_with_two_models_waits_for_the_slower_one_and_keeps_every_frame():
    keeper = FrameKeeper(depth=1)
    taken: list[int] = []
    sink = keeper.tap("gate", lambda f, timeout: taken.append(f.seq) or True, wait=True)
    keeper.models("gate", ("coco", "faces"))
    keeper.want("gate", True, False, "coco")  # nothing in view: a lossless camera is kept anyway
    keeper.want("gate", True, False, "faces")
    pooled = np.zeros((4, 6, 3), np.uint8)
    assert sink(frame(0, pooled), 0.01)
    keeper.done("gate", 0.0, "coco")
    assert not sink(frame(1, pooled), 0.01), "faces has not had frame 0 yet: the reader waits"
    keeper.done("gate", 0.0, "faces")
    assert sink(frame(1, pooled), 0.01) and taken == [0, 1]
    assert keeper.stats("gate")["frames_kept"] == 2 and keeper.stats("gate")["frames_missed"] == 0
    keeper.models("gate", ("coco",))  # a reload: faces no longer fed to it, frame 1 waits on coco alone
    assert keeper.find("gate", 1, 1.0) is not None
    keeper.done("gate", 1.0, "coco")
    assert keeper.find("gate", 1, 1.0) is None


def test_a_camera_with_two_models_is_wanted_while_either_sees_objects():
    keeper = FrameKeeper(depth=2)
    keeper.add("gate")
    keeper.models("gate", ("coco", "faces"))
    pooled = np.zeros((4, 6, 3), np.uint8)
    keeper.want("gate", True, True, "coco")
    keeper.want("gate", True, False, "faces")  # faces sees nobody; coco still does
    keeper.offer(frame(0, pooled))
    assert keeper.find("gate", 0, 0.0) is not None
    keeper.want("gate", True, False, "coco")
    keeper.offer(frame(1, pooled))
    assert keeper.find("gate", 1, 1.0) is None  # neither sees anything now
    keeper.want("gate", True, True, "faces")
    keeper.offer(frame(2, pooled))
    assert keeper.find("gate", 2, 2.0) is not None

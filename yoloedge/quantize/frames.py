"""The frames of a calibration or evaluation source: a folder of images or a video file.

A folder gives its images in name order; a video gives frames spread evenly over its length, so a
ten-second clip calibrates on its whole scene, not on its first second. `split` takes the
calibration frames and leaves the others as the held-out set the report is computed on.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from ..errors import YoloedgeError
from ..sources.folder import IMAGE_SUFFIXES
from ..sources.imagesize import read_image


class MediaError(YoloedgeError):
    """A calibration or evaluation source that gives no frame."""


@dataclass(frozen=True)
class Frame:
    name: str  # the image file, or "video.mp4#frame"
    image: np.ndarray  # BGR


def image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in IMAGE_SUFFIXES)


def source_length(path: str) -> int:
    """How many frames `path` holds: images in a folder, frames in a video."""
    p = Path(path)
    if p.is_dir():
        return len(image_files(p))
    if not p.is_file():
        raise MediaError(f"{path}: no such folder or video file")
    cap = cv2.VideoCapture(str(p))
    try:
        if not cap.isOpened():
            raise MediaError(f"{path}: not a video OpenCV can open (and not a folder of images)")
        return max(int(cap.get(cv2.CAP_PROP_FRAME_COUNT)), 0)
    finally:
        cap.release()


def spread(total: int, count: int, offset: float = 0.0) -> list[int]:
    """`count` indices in range(total), spread evenly (all of them when count >= total); each
    `offset` of a step later (0.5: in the middle of the steps)."""
    if count >= total:
        return list(range(total))
    if count <= 0:
        return []
    return sorted({int((i + offset) * total / count) for i in range(count)})


def read_frames(path: str, indices: list[int]) -> list[Frame]:
    """The frames of `path` at `indices` (sorted), BGR."""
    p = Path(path)
    if p.is_dir():
        files = image_files(p)
        return [Frame(str(files[i]), read_image(str(files[i]))) for i in indices]
    wanted = set(indices)
    frames: list[Frame] = []
    cap = cv2.VideoCapture(str(p))
    try:
        index = 0
        while wanted and index <= max(wanted):
            ok, image = cap.read()
            if not ok:
                break
            if index in wanted:
                frames.append(Frame(f"{p.name}#{index}", image))
                wanted.discard(index)
            index += 1
    finally:
        cap.release()
    return frames


@dataclass(frozen=True)
class Split:
    calibration: list[int]
    held_out: list[int]


def split(total: int, calibrate: int, evaluate: int) -> Split:
    """`calibrate` frames spread over `total`, and up to `evaluate` of the rest, spread too but
    half a step later: between the calibration frames, not next to them (the frame after a
    calibration frame shows nearly the same scene)."""
    calib = spread(total, calibrate)
    taken = set(calib)
    rest = [i for i in range(total) if i not in taken]
    return Split(calib, [rest[i] for i in spread(len(rest), evaluate, offset=0.5)])


def require_frames(path: str, frames: list[Frame], what: str) -> list[Frame]:
    if not frames:
        raise MediaError(f"{path}: no frames to {what} on (an empty folder, or a video that does not decode)")
    return frames

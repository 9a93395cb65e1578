"""The motion model: ByteTrack's constant-velocity Kalman filter on (x, y, a, h) -- box centre,
aspect ratio w/h, height -- for many tracks at once, in frame time rather than frame counts.

Upstream (ifzhang/ByteTrack, from DeepSORT) steps one frame at a time, with noise proportional to
the box height: position std h/20 and velocity std h/160 per frame. Here velocities are per second
and a step of `dt` seconds adds the noise of dt / REF_DT upstream steps. Upstream adds one step's
noise per frame whatever the rate, so its filter changes with the frame rate; here it does not, and
REF_DT says at which rate the two agree: 0.1 s, a camera sampled at 10 fps, as edge cameras
typically are (`fps:`; the demo runs at 10). At 30 fps upstream's per-frame noise adds up to three
times the variance a second; on the demo clip that follows the detections' jitter and loses a
half-hidden object's track that 10 fps keeps (the README's Tracking section has the figures).

All arrays are batched: mean (n, 8), covariance (n, 8, 8). Boxes in and out are x1 y1 x2 y2.
"""

from __future__ import annotations

import numpy as np

REF_DT = 0.1
_POS = 1.0 / 20.0   # upstream _std_weight_position
_VEL = 1.0 / 160.0  # upstream _std_weight_velocity
#: the smallest height and aspect ratio a prediction keeps, so a shrinking lost box never turns over
_MIN_SIDE = 1e-3


def xyxy_to_xyah(boxes: np.ndarray) -> np.ndarray:
    boxes = np.asarray(boxes, np.float64)
    w = boxes[:, 2] - boxes[:, 0]
    h = np.maximum(boxes[:, 3] - boxes[:, 1], _MIN_SIDE)
    return np.stack(((boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2, w / h, h), axis=1)


def xyah_to_xyxy(mean: np.ndarray) -> np.ndarray:
    h = np.maximum(mean[:, 3], _MIN_SIDE)
    w = np.maximum(mean[:, 2], _MIN_SIDE) * h
    x, y = mean[:, 0], mean[:, 1]
    return np.stack((x - w / 2, y - h / 2, x + w / 2, y + h / 2), axis=1)


def _diagonal(cov: np.ndarray) -> np.ndarray:
    """A writable (n, 8) view of the diagonals of a C-contiguous (n, 8, 8) covariance."""
    return cov.reshape(len(cov), 64)[:, ::9]


def _stds(h: np.ndarray, position: float, aspect: float, velocity: float, velocity_aspect: float) -> np.ndarray:
    """(n, 8) standard deviations: `position` x h for x, y, h; `aspect` for a; likewise the velocities."""
    std = h[:, None] * np.array([position, position, 0.0, position, velocity, velocity, 0.0, velocity])
    std[:, 2] = aspect
    std[:, 6] = velocity_aspect
    return std


def initiate(boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """New tracks at rest where the boxes are, uncertain about their velocity."""
    z = xyxy_to_xyah(boxes)
    n = len(z)
    mean = np.zeros((n, 8))
    mean[:, :4] = z
    cov = np.zeros((n, 8, 8))
    _diagonal(cov)[:] = _stds(z[:, 3], 2 * _POS, 1e-2, 10 * _VEL / REF_DT, 1e-5 / REF_DT) ** 2
    return mean, cov


def predict(mean: np.ndarray, cov: np.ndarray, dt: float) -> None:
    """Step every track `dt` seconds ahead, in place."""
    if len(mean) == 0 or dt <= 0:
        return
    steps = dt / REF_DT
    noise = steps * _stds(mean[:, 3], _POS, 1e-2, _VEL / REF_DT, 1e-5 / REF_DT) ** 2  # from the old h
    mean[:, :4] += dt * mean[:, 4:]
    motion = np.eye(8)
    motion[:4, 4:] = dt * np.eye(4)
    cov[:] = motion @ cov @ motion.T
    _diagonal(cov)[:] += noise


def update(mean: np.ndarray, cov: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tracks corrected by one measured box each; returns new (mean, cov)."""
    z = xyxy_to_xyah(boxes)
    s = cov[:, :4, :4].copy()
    s.reshape(len(s), 16)[:, ::5] += (_stds(mean[:, 3], _POS, 1e-1, 0.0, 0.0)[:, :4]) ** 2
    ph = cov[:, :, :4]                                        # P H^T, (n, 8, 4)
    gain = np.linalg.solve(s, ph.transpose(0, 2, 1)).transpose(0, 2, 1)  # P H^T S^-1 (S symmetric)
    innovation = z - mean[:, :4]
    new_mean = mean + np.einsum("nij,nj->ni", gain, innovation)
    new_cov = cov - np.einsum("nij,nkj->nik", gain, ph)     # P - K S K^T = P - K (P H^T)^T
    return new_mean, new_cov

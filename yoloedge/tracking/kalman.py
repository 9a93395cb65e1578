"""The motion model: ByteTrack's constant-velocity Kalman filter on (x, y, a, h) -- box centre,
aspect ratio w/h, height -- for many tracks at once, in frame time rather than frame counts.

Upstream (ifzhang/ByteTrack, from DeepSORT) steps one frame at a time, with noise proportional to
the box height: position std h/20 and velocity std h/160 per frame. Here velocities are per second
and a step of `dt` seconds adds the noise of dt / REF_DT upstream steps. Upstream adds one step's
noise per frame whatever the rate, so its filter changes with the frame rate; here it does not, and
REF_DT says at which rate the two agree: 0.1 s, a camera sampled at 10 fps, as edge cameras
typically are (`fps:`; the demo runs at 10). At 30 fps upstream's per-frame noise adds up to three
times the variance a second; on the demo clip that follows the detections' jitter and loses a
half-hidden object's track that 10 fps keeps (docs/integrations/tracking.md has the figures).

All arrays are batched: mean (n, 8) as (x, y, a, h, vx, vy, va, vh). The covariance is stored as
(n, 3, 4): for each of x, y, a, h the variance of the value, its covariance with its velocity and
the velocity's variance. Upstream's 8x8 matrix never holds anything else: it starts diagonal, the
motion couples each value only with its own velocity, and the noise and the measurement's are
diagonal, so the four 2x2 blocks stay independent and the filter is exact elementwise (several
times faster than 8x8 matrix products for a frame of 20 tracks). Boxes in and out are x1 y1 x2 y2.
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
    out = np.empty((len(boxes), 4))
    out[:, 0] = (boxes[:, 0] + boxes[:, 2]) / 2
    out[:, 1] = (boxes[:, 1] + boxes[:, 3]) / 2
    out[:, 2] = w / h
    out[:, 3] = h
    return out


def xyah_to_xyxy(mean: np.ndarray) -> np.ndarray:
    h = np.maximum(mean[:, 3], _MIN_SIDE)
    w = np.maximum(mean[:, 2], _MIN_SIDE) * h
    out = np.empty((len(mean), 4))
    out[:, 0] = mean[:, 0] - w / 2
    out[:, 1] = mean[:, 1] - h / 2
    out[:, 2] = out[:, 0] + w
    out[:, 3] = out[:, 1] + h
    return out


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
    var = _stds(z[:, 3], 2 * _POS, 1e-2, 10 * _VEL / REF_DT, 1e-5 / REF_DT) ** 2
    cov = np.zeros((n, 3, 4))
    cov[:, 0], cov[:, 2] = var[:, :4], var[:, 4:]
    return mean, cov


def predict(mean: np.ndarray, cov: np.ndarray, dt: float) -> None:
    """Step every track `dt` seconds ahead, in place."""
    if len(mean) == 0 or dt <= 0:
        return
    noise = (dt / REF_DT) * _stds(mean[:, 3], _POS, 1e-2, _VEL / REF_DT, 1e-5 / REF_DT) ** 2  # from the old h
    mean[:, :4] += dt * mean[:, 4:]
    pp, pv, vv = cov[:, 0], cov[:, 1], cov[:, 2]  # views: written in place, pp first (it reads the old pv)
    pp += dt * (2 * pv + dt * vv) + noise[:, :4]
    pv += dt * vv
    vv += noise[:, 4:]


def update(mean: np.ndarray, cov: np.ndarray, boxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The tracks corrected by one measured box each; returns new (mean, cov)."""
    z = xyxy_to_xyah(boxes)
    pp, pv, vv = cov[:, 0], cov[:, 1], cov[:, 2]
    s = pp + _stds(mean[:, 3], _POS, 1e-1, 0.0, 0.0)[:, :4] ** 2  # innovation variance, per value
    gain_p, gain_v = pp / s, pv / s
    innovation = z - mean[:, :4]
    new_mean = np.empty_like(mean)
    new_mean[:, :4] = mean[:, :4] + gain_p * innovation
    new_mean[:, 4:] = mean[:, 4:] + gain_v * innovation
    new_cov = np.empty_like(cov)
    keep = 1 - gain_p
    np.multiply(pp, keep, out=new_cov[:, 0])
    np.multiply(pv, keep, out=new_cov[:, 1])
    new_cov[:, 2] = vv - gain_v * pv
    return new_mean, new_cov

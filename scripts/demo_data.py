"""Deterministic synthetic data for the demo model: coloured shapes on textured backgrounds.

The demo model the project ships is trained only on what this module draws, so that no COCO
model (or any other third-party weight or data set) has to ship with yoloedge. Everything is
drawn with numpy and OpenCV from a seeded `numpy.random.Generator`: the same seed gives the same
pixels and the same boxes.

Classes (index: label), told apart by their outline only; the fill colour is random:

    0: circle     a filled disc
    1: square     a filled square, rotated by any angle (a 45-degree square looks like a diamond)
    2: triangle   a filled equilateral triangle, rotated by any angle
    3: star       a filled five-pointed star (inner radius 0.45 of the outer), rotated
    4: cross      a filled plus sign (arm half-width 0.3 of the arm length), rotated

Each shape has a size (its circumradius, `r`), a centre, a rotation, and a fill colour drawn at
random but kept away from the background colour under it (at least `MIN_CONTRAST` apart, BGR
Euclidean distance), with a slight shading gradient and noise so fills are not flat. Shapes are
rasterised with 4x4 supersampling inside their own box, so edges are anti-aliased.

Backgrounds (one per scene or clip, `render_background`): smooth value noise, linear gradients,
stripes (hard or sinusoidal, any angle), heavily blurred colour blobs, a checkerboard, and mixtures
of these with fine noise on top.

Boxes are exact: pixel (i, j) covers [i, i+1) x [j, j+1), and a shape's box is the box of its
analytic outline (a circle's centre +- r, a polygon's vertices), clipped to the image. Each box
comes with `visible`, the fraction of the shape's analytic area that ends up visible (inside the
image and not covered by shapes drawn after it), and `difficult` (visible < `DIFFICULT_VISIBLE`,
or a clipped side under 4 px): such objects are hard to see and are ignored in evaluation, as
PASCAL VOC does with its own "difficult" objects.

Public functions:

    render_background(rng, size) -> image
    random_objects(rng, size, n) -> [Shape]
    render_scene(rng, size, objects, background=None) -> (image_bgr, boxes)
    make_dataset(out_dir, n_train, n_val, imgsz, seed) -> data.yaml path   (Ultralytics YOLO layout)
    make_clip(path, frames, size, fps, seed) -> ground truth dict          (video + boxes per frame)

`size` is always (width, height) in pixels. Run `python scripts/demo_data.py --help` for a CLI.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import cv2
import numpy as np

NAMES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")
SUPERSAMPLE = 4
MIN_CONTRAST = 90.0  # least BGR distance between a fill colour and the mean background under it
DIFFICULT_VISIBLE = 0.4  # objects with less of their area visible are marked difficult
LABEL_MIN_VISIBLE = 0.25  # training labels are written for objects at least this visible
STAR_INNER = 0.45
CROSS_HALF_WIDTH = 0.3


@dataclass
class Shape:
    """One shape to draw. `r` is the circumradius in pixels, `theta` the rotation in radians."""
    class_id: int
    cx: float
    cy: float
    r: float
    theta: float
    color: tuple[int, int, int] | None = None  # BGR; None: picked against the background
    shade: tuple[float, float, float] = (0.0, 0.0, 0.0)  # gradient direction x, y and strength

    @property
    def label(self) -> str:
        return NAMES[self.class_id]


# -- geometry -----------------------------------------------------------------------------------

def outline(shape: Shape) -> np.ndarray | None:
    """The polygon (n, 2) of a shape in image coordinates, or None for a circle."""
    c = shape.class_id
    if c == 0:
        return None
    if c == 1:
        angles = np.pi / 4 + np.arange(4) * np.pi / 2
        radii = np.ones(4)
    elif c == 2:
        angles = -np.pi / 2 + np.arange(3) * 2 * np.pi / 3
        radii = np.ones(3)
    elif c == 3:
        angles = -np.pi / 2 + np.arange(10) * np.pi / 5
        radii = np.where(np.arange(10) % 2 == 0, 1.0, STAR_INNER)
    elif c == 4:
        # a plus sign: arm length 1, arm half-width w, as 12 vertices
        w = CROSS_HALF_WIDTH
        l = math.sqrt(1 - w * w)  # so that the arm corners lie on the unit circle
        pts = np.array([(w, -l), (w, -w), (l, -w), (l, w), (w, w), (w, l),
                        (-w, l), (-w, w), (-l, w), (-l, -w), (-w, -w), (-w, -l)])
        return _place(pts, shape)
    else:
        raise ValueError(f"unknown class id {c}")
    pts = np.stack([np.cos(angles) * radii, np.sin(angles) * radii], axis=1)
    return _place(pts, shape)


def _place(unit: np.ndarray, shape: Shape) -> np.ndarray:
    ct, st = math.cos(shape.theta), math.sin(shape.theta)
    rot = np.array([[ct, -st], [st, ct]])
    return unit @ rot.T * shape.r + np.array([shape.cx, shape.cy])


def full_box(shape: Shape) -> tuple[float, float, float, float]:
    """The shape's exact box (unclipped), x1 y1 x2 y2."""
    poly = outline(shape)
    if poly is None:
        return (shape.cx - shape.r, shape.cy - shape.r, shape.cx + shape.r, shape.cy + shape.r)
    return (float(poly[:, 0].min()), float(poly[:, 1].min()),
            float(poly[:, 0].max()), float(poly[:, 1].max()))


def area(shape: Shape) -> float:
    """The shape's analytic area in square pixels."""
    poly = outline(shape)
    if poly is None:
        return math.pi * shape.r * shape.r
    x, y = poly[:, 0], poly[:, 1]
    return 0.5 * abs(float(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))))


def _coverage(shape: Shape, x0: int, y0: int, x1: int, y1: int) -> np.ndarray:
    """Anti-aliased coverage (float32 0..1) of the shape over pixels [x0, x1) x [y0, y1)."""
    s = SUPERSAMPLE
    w, h = x1 - x0, y1 - y0
    mask = np.zeros((h * s, w * s), np.uint8)
    shift = 4
    one = 1 << shift
    poly = outline(shape)
    # continuous coordinate u (pixel k covers [k, k+1)) -> OpenCV's pixel-centre coordinate u - 0.5
    if poly is None:
        cx = int(round(((shape.cx - x0) * s - 0.5) * one))
        cy = int(round(((shape.cy - y0) * s - 0.5) * one))
        cv2.circle(mask, (cx, cy), int(round(shape.r * s * one)), 255, -1, cv2.LINE_8, shift)
    else:
        pts = np.round(((poly - [x0, y0]) * s - 0.5) * one).astype(np.int32)
        cv2.fillPoly(mask, [pts], 255, cv2.LINE_8, shift)
    return cv2.resize(mask, (w, h), interpolation=cv2.INTER_AREA).astype(np.float32) / 255.0


# -- backgrounds --------------------------------------------------------------------------------

def _random_color(rng: np.random.Generator, sat=(0.0, 1.0), val=(0.15, 1.0)) -> np.ndarray:
    hsv = np.array([[[rng.uniform(0, 180), rng.uniform(*sat) * 255, rng.uniform(*val) * 255]]],
                   np.float32)
    return cv2.cvtColor(hsv.astype(np.uint8), cv2.COLOR_HSV2BGR)[0, 0].astype(np.float32)


def _value_noise(rng: np.random.Generator, w: int, h: int, cells: int) -> np.ndarray:
    """Smooth noise in 0..1: a coarse random grid upsampled with bicubic interpolation."""
    gw, gh = max(2, cells), max(2, int(round(cells * h / w)))
    grid = rng.random((gh, gw)).astype(np.float32)
    up = cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC)
    return np.clip(up, 0, 1)


def _blend(a: np.ndarray, b: np.ndarray, t: np.ndarray) -> np.ndarray:
    return a * (1 - t[..., None]) + b * t[..., None]


def render_background(rng: np.random.Generator, size: tuple[int, int]) -> np.ndarray:
    """A textured BGR uint8 background: noise, gradient, stripes, blobs, checkerboard or a mix."""
    w, h = size
    kind = rng.choice(["noise", "gradient", "stripes", "blobs", "checker", "mix"])
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c1, c2 = _random_color(rng), _random_color(rng)
    if kind == "noise":
        t = _value_noise(rng, w, h, int(rng.integers(3, 24)))
        img = _blend(np.full((h, w, 3), c1), np.full((h, w, 3), c2), t)
    elif kind == "gradient":
        a = rng.uniform(0, 2 * np.pi)
        proj = xx * math.cos(a) + yy * math.sin(a)
        t = (proj - proj.min()) / max(float(np.ptp(proj)), 1.0)
        img = _blend(np.full((h, w, 3), c1), np.full((h, w, 3), c2), t)
        c3 = _random_color(rng)
        img = _blend(img, np.full((h, w, 3), c3), _value_noise(rng, w, h, 3) * 0.5)
    elif kind == "stripes":
        a = rng.uniform(0, np.pi)
        period = rng.uniform(6, 60)
        proj = xx * math.cos(a) + yy * math.sin(a)
        t = 0.5 + 0.5 * np.sin(2 * np.pi * proj / period)
        if rng.random() < 0.5:
            t = (t > 0.5).astype(np.float32)
        img = _blend(np.full((h, w, 3), c1), np.full((h, w, 3), c2), t)
    elif kind == "blobs":
        img = np.full((h, w, 3), c1, np.float32)
        for _ in range(int(rng.integers(6, 30))):
            c = tuple(float(v) for v in _random_color(rng))
            center = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            cv2.circle(img, center, int(rng.integers(8, max(9, w // 4))), c, -1)
        sigma = rng.uniform(6, 20)
        img = cv2.GaussianBlur(img, (0, 0), sigma)
    elif kind == "checker":
        cell = rng.uniform(8, 48)
        t = ((np.floor(xx / cell) + np.floor(yy / cell)) % 2).astype(np.float32)
        img = _blend(np.full((h, w, 3), c1), np.full((h, w, 3), c2), t)
        img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.5, 3))
    else:  # mix: noise in two colours with stripes faintly on top
        t = _value_noise(rng, w, h, int(rng.integers(2, 10)))
        img = _blend(np.full((h, w, 3), c1), np.full((h, w, 3), c2), t)
        a = rng.uniform(0, np.pi)
        s = np.sin(2 * np.pi * (xx * math.cos(a) + yy * math.sin(a)) / rng.uniform(4, 30))
        img = img + (s * rng.uniform(5, 30))[..., None]
    img = img + rng.normal(0, rng.uniform(1, 10), (h, w, 1)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


# -- scenes -------------------------------------------------------------------------------------

def random_objects(rng: np.random.Generator, size: tuple[int, int], n: int,
                   r_range: tuple[float, float] | None = None, max_overlap: float = 0.3,
                   edge_fraction: float = 0.2) -> list[Shape]:
    """`n` random shapes (fewer if they cannot be placed): any class, size, rotation, position.

    Boxes overlap by at most `max_overlap` of the smaller box; about `edge_fraction` of the shapes
    are allowed to stick out of the image.
    """
    w, h = size
    lo, hi = r_range or (max(5.0, min(w, h) * 0.03), min(w, h) * 0.17)
    shapes: list[Shape] = []
    boxes: list[tuple[float, float, float, float]] = []
    for _ in range(n * 20):
        if len(shapes) >= n:
            break
        r = float(math.exp(rng.uniform(math.log(lo), math.log(hi))))  # log-uniform sizes
        margin = -0.6 * r if rng.random() < edge_fraction else r
        if 2 * margin >= min(w, h):
            continue
        s = Shape(class_id=int(rng.integers(len(NAMES))),
                  cx=float(rng.uniform(margin, w - margin)), cy=float(rng.uniform(margin, h - margin)),
                  r=r, theta=float(rng.uniform(0, 2 * np.pi)),
                  shade=(float(rng.normal()), float(rng.normal()), float(rng.uniform(0, 0.25))))
        b = full_box(s)
        if all(_overlap(b, o) <= max_overlap for o in boxes):
            shapes.append(s)
            boxes.append(b)
    return shapes


def _overlap(a, b) -> float:
    """Intersection over the smaller box's area."""
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    small = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return iw * ih / max(small, 1e-9)


def pick_color(rng: np.random.Generator, under: np.ndarray) -> tuple[int, int, int]:
    """A random fill colour at least MIN_CONTRAST from `under` (the mean background colour)."""
    best, best_d = None, -1.0
    for _ in range(30):
        c = _random_color(rng, sat=(0.0, 1.0), val=(0.1, 1.0))
        d = float(np.linalg.norm(c - under))
        if d >= MIN_CONTRAST:
            return tuple(int(v) for v in c)
        if d > best_d:
            best, best_d = c, d
    return tuple(int(v) for v in best)


def _clip_box(b, w, h):
    return (min(max(b[0], 0.0), w), min(max(b[1], 0.0), h), min(max(b[2], 0.0), w), min(max(b[3], 0.0), h))


def render_scene(rng: np.random.Generator, size: tuple[int, int], objects: int | Sequence[Shape],
                 background: np.ndarray | None = None, effects: bool = True) -> tuple[np.ndarray, list[dict]]:
    """Draw shapes over a background; returns (BGR uint8 image, boxes).

    `objects`: a list of `Shape` (drawn in order, later ones on top; a shape whose `color` is None
    gets one picked against the background and stored back into it) or a number of random shapes.
    `background`: a (h, w, 3) uint8 image, or None for a random one from `rng`.
    `effects`: a little random blur, sensor noise and brightness/contrast change over the result.

    Each box is {"class_id", "label", "box": [x1, y1, x2, y2] (clipped to the image, float pixels),
    "visible" (0..1), "difficult" (bool)}, in drawing order; shapes wholly outside are left out.
    """
    w, h = size
    if isinstance(objects, (int, np.integer)):
        objects = random_objects(rng, size, int(objects))
    bg = render_background(rng, size) if background is None else background
    if bg.shape != (h, w, 3):
        raise ValueError(f"background is {bg.shape[1]}x{bg.shape[0]}, the scene {w}x{h}")
    img = bg.astype(np.float32)
    placed = []
    for s in objects:
        x1, y1, x2, y2 = _clip_box(full_box(s), w, h)
        X0, Y0 = int(math.floor(x1)), int(math.floor(y1))
        X1, Y1 = int(math.ceil(x2)), int(math.ceil(y2))
        if X1 <= X0 or Y1 <= Y0:
            continue
        alpha = _coverage(s, X0, Y0, X1, Y1)
        roi = img[Y0:Y1, X0:X1]
        if s.color is None:
            weights = alpha[..., None]
            under = (bg[Y0:Y1, X0:X1].astype(np.float32) * weights).sum((0, 1)) / max(float(weights.sum()), 1e-6)
            s.color = pick_color(rng, under)
        yy, xx = np.mgrid[Y0:Y1, X0:X1].astype(np.float32)
        gx, gy, k = s.shade
        norm = math.hypot(gx, gy) or 1.0
        ramp = ((xx - s.cx) * gx + (yy - s.cy) * gy) / (norm * max(s.r, 1.0))  # -1..1 across the shape
        fill = np.array(s.color, np.float32) * (1.0 + k * ramp)[..., None]
        fill = fill + rng.normal(0, 4, fill.shape[:2] + (1,)).astype(np.float32)
        roi[:] = roi * (1 - alpha[..., None]) + np.clip(fill, 0, 255) * alpha[..., None]
        placed.append((s, (x1, y1, x2, y2), (X0, Y0, X1, Y1), alpha))
    # visibility, from the top of the stack down: what is covered by the shapes drawn later
    cover = np.zeros((h, w), np.float32)
    boxes: list[dict] = []
    for s, box, (X0, Y0, X1, Y1), alpha in reversed(placed):
        c = cover[Y0:Y1, X0:X1]
        seen = float((alpha * (1 - c)).sum())
        c += alpha * (1 - c)
        visible = min(1.0, seen / max(area(s), 1e-6))
        bw, bh = box[2] - box[0], box[3] - box[1]
        boxes.append({"class_id": s.class_id, "label": s.label, "box": [float(v) for v in box],
                      "visible": visible,
                      "difficult": bool(visible < DIFFICULT_VISIBLE or min(bw, bh) < 4.0)})
    boxes.reverse()
    if effects:
        if rng.random() < 0.3:
            img = cv2.GaussianBlur(img, (0, 0), rng.uniform(0.4, 1.2))
        gain, offset = rng.uniform(0.8, 1.2), rng.uniform(-20, 20)
        img = img * gain + offset + rng.normal(0, rng.uniform(0, 6), (h, w, 1)).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8), boxes


# -- data set -----------------------------------------------------------------------------------

def _yolo_line(b: dict, w: int, h: int) -> str:
    x1, y1, x2, y2 = b["box"]
    return (f"{b['class_id']} {(x1 + x2) / 2 / w:.6f} {(y1 + y2) / 2 / h:.6f} "
            f"{(x2 - x1) / w:.6f} {(y2 - y1) / h:.6f}")


def make_dataset(out_dir: str | Path, n_train: int, n_val: int, imgsz: int = 320, seed: int = 0) -> Path:
    """Write an Ultralytics YOLO data set and return the path of its data.yaml.

    Layout: images/{train,val}/NNNNNN.jpg, labels/{train,val}/NNNNNN.txt (one `class cx cy w h`
    line per object, normalised to 0..1), data.yaml (`path`, `train`, `val`, `names`). Images are
    `imgsz` x `imgsz`, 0 to 8 shapes each, saved as JPEG at a random quality 60-95 (so the model
    sees compression artefacts, as it will from a video). Objects less than LABEL_MIN_VISIBLE
    visible get no label. Train and val come from separate random streams of the same seed.
    """
    out = Path(out_dir)
    for split, n, stream in (("train", n_train, 1), ("val", n_val, 2)):
        rng = np.random.default_rng([seed, stream])
        (out / "images" / split).mkdir(parents=True, exist_ok=True)
        (out / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img, boxes = render_scene(rng, (imgsz, imgsz), int(rng.integers(0, 9)))
            quality = int(rng.integers(60, 96))
            ok, jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
            assert ok
            (out / "images" / split / f"{i:06d}.jpg").write_bytes(jpg.tobytes())
            lines = [_yolo_line(b, imgsz, imgsz) for b in boxes if b["visible"] >= LABEL_MIN_VISIBLE]
            (out / "labels" / split / f"{i:06d}.txt").write_text("".join(line + "\n" for line in lines))
    data = out / "data.yaml"
    names = "\n".join(f"  {i}: {n}" for i, n in enumerate(NAMES))
    data.write_text(f"path: {out.resolve()}\ntrain: images/train\nval: images/val\n"
                    f"nc: {len(NAMES)}\nnames:\n{names}\n")
    return data


# -- clip ---------------------------------------------------------------------------------------

@dataclass
class Track:
    """A shape moving along a straight line with a small sinusoidal wobble, and turning."""
    class_id: int
    r: float
    px: float  # where it is at frame tc
    py: float
    vx: float  # px per frame
    vy: float
    tc: float
    theta0: float
    spin: float  # rad per frame
    wobble: tuple[float, float, float]  # amplitude px, angular frequency per frame, phase
    shade: tuple[float, float, float]
    color: tuple[int, int, int] | None = None

    def at(self, t: float) -> Shape:
        a, f, ph = self.wobble
        dx, dy = t - self.tc, math.sin(f * t + ph) * a
        # wobble perpendicular to the motion
        n = math.hypot(self.vx, self.vy) or 1.0
        cx = self.px + self.vx * dx - self.vy / n * dy
        cy = self.py + self.vy * dx + self.vx / n * dy
        return Shape(self.class_id, cx, cy, self.r, self.theta0 + self.spin * t, self.color, self.shade)


def _plan_tracks(rng: np.random.Generator, size: tuple[int, int], frames: int,
                 n_tracks: int, max_overlap: float = 0.25) -> list[Track]:
    w, h = size
    s = min(w, h)
    tracks: list[Track] = []
    paths: list[list[tuple[float, float, float, float]]] = []
    classes = [i % len(NAMES) for i in range(n_tracks)]
    rng.shuffle(classes)
    for k in range(n_tracks):
        for _ in range(400):
            slow = k < n_tracks // 3  # a third wander slowly and mostly stay in view
            speed = rng.uniform(0.4, 1.2) if slow else rng.uniform(1.5, 4.5)
            a = rng.uniform(0, 2 * np.pi)
            t = Track(class_id=int(classes[k]), r=float(rng.uniform(0.06, 0.16) * s),
                      px=float(rng.uniform(0.15, 0.85) * w), py=float(rng.uniform(0.15, 0.85) * h),
                      vx=speed * math.cos(a), vy=speed * math.sin(a),
                      tc=float(rng.uniform(0, frames) if not slow else frames / 2),
                      theta0=float(rng.uniform(0, 2 * np.pi)), spin=float(rng.uniform(-0.05, 0.05)),
                      wobble=(float(rng.uniform(0, 0.05) * s), float(rng.uniform(0.03, 0.15)),
                              float(rng.uniform(0, 2 * np.pi))),
                      shade=(float(rng.normal()), float(rng.normal()), float(rng.uniform(0, 0.2))))
            path = [full_box(t.at(i)) for i in range(frames)]
            if all(_overlap(a_, b_) <= max_overlap for other in paths for a_, b_ in zip(path, other)):
                tracks.append(t)
                paths.append(path)
                break
    return tracks


def render_clip(size: tuple[int, int] = (480, 270), frames: int = 100, seed: int = 0,
                n_tracks: int = 10):
    """Yield (frame_bgr, boxes) for each frame of the clip `seed` describes (no file written).

    One static background; `n_tracks` shapes move smoothly across it (a third slowly, mostly in
    view; the rest faster, entering and leaving through the edges at various times). Boxes of
    different shapes overlap by at most a quarter of the smaller box. Each box also carries
    "track", the index of its shape. Shapes keep their colour for the whole clip.
    """
    w, h = size
    rng = np.random.default_rng([seed, 3])
    bg = render_background(rng, size)
    tracks = _plan_tracks(rng, size, frames, n_tracks)
    for t in tracks:  # one colour per track, against the background along its path
        under = [bg[int(min(max(sh.cy, 0), h - 1)), int(min(max(sh.cx, 0), w - 1))].astype(np.float32)
                 for sh in (t.at(i) for i in range(0, frames, 5))]
        t.color = pick_color(rng, np.mean(under, axis=0))
    for i in range(frames):
        shapes = [t.at(i) for t in tracks]
        frame_rng = np.random.default_rng([seed, 4, i])  # fill noise and sensor noise per frame
        img, boxes = render_scene(frame_rng, size, shapes, background=bg, effects=False)
        img = np.clip(img.astype(np.float32) + frame_rng.normal(0, 2, img.shape[:2] + (1,)), 0, 255)
        drawn = iter(boxes)
        out = []
        for k, sh in enumerate(shapes):  # render_scene leaves out shapes wholly outside
            x1, y1, x2, y2 = _clip_box(full_box(sh), w, h)
            if math.ceil(x2) <= math.floor(x1) or math.ceil(y2) <= math.floor(y1):
                continue
            b = next(drawn)
            b["track"] = k
            out.append(b)
        yield img.astype(np.uint8), out


def make_clip(path: str | Path, frames: int = 100, size: tuple[int, int] = (480, 270), fps: float = 10.0,
              seed: int = 0) -> dict:
    """Write a video of moving shapes to `path` and return its ground truth.

    The codec follows the suffix: .mp4 -> mp4v (MPEG-4 Part 2), .avi -> MJPG; both are written by
    opencv-python(-headless) without any system codec. Returns
    {"frames": [{"index": i, "objects": [{"class_id", "label", "box": [x1, y1, x2, y2],
    "visible", "difficult", "track"}]}], "names": [...], "size": [w, h], "fps": fps, "seed": seed,
    "codec": fourcc}. Boxes are in pixels of the video, rounded to 0.01. `difficult` objects
    (mostly outside the frame or hidden) are meant to be ignored by evaluation.
    """
    path = Path(path)
    fourcc = {".mp4": "mp4v", ".avi": "MJPG"}.get(path.suffix.lower())
    if fourcc is None:
        raise ValueError(f"{path}: use .mp4 (mp4v) or .avi (MJPG)")
    w, h = size
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), float(fps), (w, h))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {fourcc} to {path}")
    truth = []
    try:
        for i, (img, boxes) in enumerate(render_clip(size, frames, seed)):
            writer.write(img)
            truth.append({"index": i, "objects": [
                {"class_id": b["class_id"], "label": b["label"], "box": [round(v, 2) for v in b["box"]],
                 "visible": round(b["visible"], 3), "difficult": b["difficult"], "track": b["track"]}
                for b in boxes]})
    finally:
        writer.release()
    return {"frames": truth, "names": list(NAMES), "size": [w, h], "fps": fps, "seed": seed,
            "codec": fourcc}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Generate the demo's synthetic shapes data.")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dataset", help="write an Ultralytics YOLO data set")
    d.add_argument("out_dir")
    d.add_argument("--train", type=int, default=3000)
    d.add_argument("--val", type=int, default=300)
    d.add_argument("--imgsz", type=int, default=320)
    d.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("clip", help="write a clip and its ground truth JSON")
    c.add_argument("path", help="clip.mp4 or clip.avi")
    c.add_argument("truth", help="ground truth JSON")
    c.add_argument("--frames", type=int, default=100)
    c.add_argument("--size", type=int, nargs=2, default=(480, 270), metavar=("W", "H"))
    c.add_argument("--fps", type=float, default=10.0)
    c.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("scene", help="write one random scene as an image (and its boxes as JSON)")
    s.add_argument("path")
    s.add_argument("--size", type=int, nargs=2, default=(320, 320), metavar=("W", "H"))
    s.add_argument("--objects", type=int, default=6)
    s.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.cmd == "dataset":
        print(make_dataset(args.out_dir, args.train, args.val, args.imgsz, args.seed))
    elif args.cmd == "clip":
        truth = make_clip(args.path, args.frames, tuple(args.size), args.fps, args.seed)
        Path(args.truth).write_text(json.dumps(truth, separators=(",", ":")) + "\n")
    else:
        img, boxes = render_scene(np.random.default_rng(args.seed), tuple(args.size), args.objects)
        cv2.imwrite(args.path, img)
        print(json.dumps(boxes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

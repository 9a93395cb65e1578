#!/usr/bin/env python3
"""Write the demo clip and its ground truth: yoloedge/demo/clip.mp4 + yoloedge/demo/clip_truth.json.

The clip is `demo_data.make_clip` with fixed parameters (seed 0, 100 frames of 480x270 at 10 fps,
MPEG-4 Part 2 "mp4v", which opencv-python-headless writes without any system codec), so it can be
regenerated bit for bit on the same OpenCV build, or made at start instead of being shipped.
After writing, it decodes the clip again and checks the frame count and how well the colours
survived compression (PSNR, and the mean colour error inside the objects' boxes).

    .venv/bin/python scripts/make_demo_clip.py            # runs with yoloedge's own dependencies
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import cv2
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import demo_data  # noqa: E402

FRAMES, SIZE, FPS, SEED = 100, (480, 270), 10.0, 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(HERE.parent / "yoloedge" / "demo"), help="folder for the clip")
    p.add_argument("--ext", choices=("mp4", "avi"), default="mp4", help="mp4 (mp4v) or avi (MJPG)")
    p.add_argument("--frames", type=int, default=FRAMES)
    p.add_argument("--size", type=int, nargs=2, default=SIZE, metavar=("W", "H"))
    p.add_argument("--fps", type=float, default=FPS)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--max-mb", type=float, default=1.5, help="fail if the clip is larger")
    args = p.parse_args(argv)

    out = Path(args.out)
    clip = out / f"clip.{args.ext}"
    for old in out.glob("clip.*"):  # one clip only: yoloedge.demo.clip_path() takes the first it finds
        if old.suffix in (".mp4", ".avi") and old != clip:
            old.unlink()
    truth = demo_data.make_clip(clip, args.frames, tuple(args.size), args.fps, args.seed)
    (out / "clip_truth.json").write_text(json.dumps(truth, separators=(",", ":")) + "\n")

    # check: frame count and colour fidelity against the frames as rendered
    cap = cv2.VideoCapture(str(clip))
    decoded = []
    while True:
        ok, frame = cap.read()
        if not ok:
            break
        decoded.append(frame)
    cap.release()
    psnr, box_err = [], []
    for frame, (ref, boxes) in zip(decoded, demo_data.render_clip(tuple(args.size), args.frames, args.seed)):
        psnr.append(cv2.PSNR(frame, ref))
        for b in boxes:
            if b["difficult"]:
                continue
            x1, y1, x2, y2 = (int(round(v)) for v in b["box"])
            a = frame[y1:y2, x1:x2].reshape(-1, 3).astype(np.float32).mean(0)
            r = ref[y1:y2, x1:x2].reshape(-1, 3).astype(np.float32).mean(0)
            box_err.append(float(np.linalg.norm(a - r)))
    size_mb = clip.stat().st_size / 1e6
    objects = sum(len(f["objects"]) for f in truth["frames"])
    print(f"{clip}: {len(decoded)} frames decoded of {args.frames}, {args.size[0]}x{args.size[1]} "
          f"at {args.fps:g} fps, {truth['codec']}, {size_mb:.2f} MB")
    print(f"{out / 'clip_truth.json'}: {objects} boxes, "
          f"{sum(o['difficult'] for f in truth['frames'] for o in f['objects'])} difficult")
    print(f"colour fidelity: PSNR mean {np.mean(psnr):.1f} dB (min {np.min(psnr):.1f}); mean BGR error "
          f"inside boxes {np.mean(box_err):.1f} (max {np.max(box_err):.1f}) of 441")
    if len(decoded) != args.frames:
        print("error: the clip does not decode to the number of frames written", file=sys.stderr)
        return 1
    if size_mb > args.max_mb:
        print(f"error: the clip is {size_mb:.2f} MB, over {args.max_mb} MB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

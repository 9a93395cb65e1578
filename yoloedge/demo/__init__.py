"""The demo the project ships: a small model trained on synthetic shapes, a clip of the same
shapes, and `yoloedge demo`, which runs the whole daemon on them with a local broker."""

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent
MODEL = DEMO_DIR / "model.onnx"
LABELS = DEMO_DIR / "labels.txt"
TRUTH = DEMO_DIR / "clip_truth.json"


def clip_path() -> Path:
    """The demo clip (its container depends on what OpenCV could write when it was made)."""
    for name in ("clip.mp4", "clip.avi"):
        if (DEMO_DIR / name).exists():
            return DEMO_DIR / name
    return DEMO_DIR / "clip.mp4"

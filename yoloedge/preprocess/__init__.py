"""Frames in, model input tensors out: letterbox written straight into the batch buffer."""

from .letterbox import Geometry, Letterboxer, LetterboxStyle, Resizer, compute_geometry, family_style

__all__ = ["Geometry", "Letterboxer", "LetterboxStyle", "Resizer", "compute_geometry", "family_style"]

"""What post-processing and routing need to know of the model: its layout, labels and decoder.

Every device of an accelerator group loads the same model file (a reopening checks it is still
the one, see `model.identity`), so the description is the group's, not one device's: the device
that loads it hands it on frozen, with each output set it fills, and nothing downstream reaches
back into a device worker for it. Its `postprocess` is shared by the post-processing threads; it
keeps no state between calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..postprocess import Layout, Postprocessor

if TYPE_CHECKING:
    from .detector import Detector


@dataclass(frozen=True)
class ModelInfo:
    name: str  # `ModelConfig.name`: what the results say they came from
    labels: tuple[str, ...]
    layout: Layout
    postprocess: Postprocessor

    @classmethod
    def of(cls, detector: Detector) -> ModelInfo:
        return cls(detector.config.name, tuple(detector.labels), detector.layout, detector.postprocess_one)

"""Typed configuration objects, built once and passed down (no globals, no environment reads).

The YAML loader (`yoloedge run -c`) fills these; `yoloedge detect` fills them from its flags.
"""

from .model import ModelConfig, OnnxRuntimeConfig, PROVIDERS

__all__ = ["ModelConfig", "OnnxRuntimeConfig", "PROVIDERS"]

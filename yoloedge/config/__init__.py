"""Typed configuration objects, built once and passed down (no globals, no environment reads).

`loader.load_config(path, environ)` reads and validates the YAML file; `yoloedge detect` fills the
model objects from its flags.
"""

from .model import ModelConfig, OnnxRuntimeConfig
from .providers import PROVIDERS
from .schema import (BACKENDS, AcceleratorConfig, CameraConfig, Config, ControlConfig, HealthConfig,
                     LoggingConfig, MqttConfig, TlsConfig)

__all__ = ["BACKENDS", "PROVIDERS", "AcceleratorConfig", "CameraConfig", "Config", "ControlConfig",
           "HealthConfig", "LoggingConfig", "ModelConfig", "MqttConfig", "OnnxRuntimeConfig", "TlsConfig"]

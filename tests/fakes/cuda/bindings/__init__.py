"""Fake `cuda.bindings` (cuda-python >= 12.6.1): `runtime` and `utils`; `_fake` holds the state."""

from . import _fake, runtime, utils  # noqa: F401  (submodules are attributes, as in cuda-python)

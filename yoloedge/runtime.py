"""Whether an optional module is installed, without importing it.

Several parts of yoloedge depend on modules that may be absent or costly to import: a backend's
runtime (`tensorrt`, `acl`: seconds, and the driver touched), PyGObject, PyAV (FFmpeg's libraries
loaded), a GPU JPEG decoder (CUDA started). Config validation and `yoloedge check` only ask
whether such a module could be imported, so they look for it with `importlib.util.find_spec`,
which imports nothing but the parent packages of a dotted name. This is the one place that does
it; a foundation module, so the config layer may ask too.
"""

from __future__ import annotations

import importlib.util


def module_installed(name: str) -> bool:
    """Whether module `name` (dotted names too) can be found on the import path. A missing or
    broken parent package (`nvidia` for `nvidia.nvimgcodec`) counts as not installed."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package is missing, or a module's __spec__ is None
        return False

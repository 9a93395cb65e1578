"""One exception hierarchy, so callers can tell a user mistake from a device fault."""


class YoloedgeError(Exception):
    """Base of every error yoloedge raises on purpose."""


class ModelError(YoloedgeError):
    """A model file is missing, unreadable, or not a YOLO detector we can drive."""


class LayoutError(ModelError):
    """The model's outputs do not match any YOLO output layout (or the one configured)."""


class ImageError(YoloedgeError):
    """An input image is missing or cannot be decoded."""


class BackendError(YoloedgeError):
    """An accelerator runtime refused or failed an operation."""


class BackendUnavailableError(BackendError):
    """The runtime a backend needs is not installed; the message says what to install."""

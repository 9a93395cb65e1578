"""Camera sources: opening URLs (capture), reading them robustly into frame queues (reader)."""

from .capture import SourceError, SourceKind, UnsupportedSourceError, open_source, source_kind
from .reader import CameraReader
from .state import CameraState

__all__ = ["CameraReader", "CameraState", "SourceError", "SourceKind", "UnsupportedSourceError",
           "open_source", "source_kind"]

"""Camera sources: opening URLs (capture), reading them robustly into a frame sink (reader)."""

from .capture import SourceError, SourceKind, UnsupportedSourceError, open_source, source_kind
from .frame import Frame, FrameSink, SinkClosed
from .reader import CameraReader
from .state import CameraState

__all__ = ["CameraReader", "CameraState", "Frame", "FrameSink", "SinkClosed", "SourceError", "SourceKind",
           "UnsupportedSourceError", "open_source", "source_kind"]

"""Camera sources: one module per kind (`base` says what a source is), opening a camera with its
decoder (`opening`), and reading it robustly into a frame sink (`reader`)."""

from .base import SourceError, SourceKind, UnsupportedSourceError, source_kind
from .frame import Frame, FrameSink, SinkClosed
from .opening import open_source
from .reader import CameraReader
from .state import CameraState

__all__ = ["CameraReader", "CameraState", "Frame", "FrameSink", "SinkClosed", "SourceError", "SourceKind",
           "UnsupportedSourceError", "open_source", "source_kind"]

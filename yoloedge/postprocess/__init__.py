"""Shared YOLO post-processing: layout recognition, decoders, NMS and result mapping."""

from .decode import make_decoder
from .detections import Detections, label_of
from .layouts import FORMATS, Layout, detect_layout
from .nms import batched_nms, nms
from .postprocessor import PostprocessSettings, Postprocessor

__all__ = ["FORMATS", "Detections", "Layout", "PostprocessSettings", "Postprocessor",
           "batched_nms", "detect_layout", "label_of", "make_decoder", "nms"]

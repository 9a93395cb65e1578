"""yoloedge: YOLO object detection on camera streams at the edge, published over MQTT."""

__version__ = "0.1.0"

#: the most pixels of any image or frame yoloedge decodes: 8192 x 8192 (64 Mi pixels, 192 MiB as
#: BGR); see `yoloedge.sources.imagesize` and `yoloedge.cli.main.cap_opencv_decoders`.
MAX_IMAGE_PIXELS = 8192 * 8192

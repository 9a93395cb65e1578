"""yoloedge: YOLO object detection on camera streams at the edge, published over MQTT."""

__version__ = "0.1.0"

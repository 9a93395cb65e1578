"""Publishing results: MQTT topics (`topics`) and the MQTT client of the daemon (`mqtt`)."""

from ..timeutil import utc_timestamp
from .mqtt import MqttPublisher, encode_payload
from .topics import Topics, camera_state_topic, detections_topic, stats_topic, status_topic

__all__ = ["MqttPublisher", "Topics", "camera_state_topic", "detections_topic", "encode_payload",
           "stats_topic", "status_topic", "utc_timestamp"]

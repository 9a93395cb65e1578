"""Publishing results: MQTT topics (`topics`) and the MQTT client of the daemon (`mqtt`)."""

from .mqtt import MqttPublisher, encode_payload, utc_timestamp
from .topics import Topics, camera_state_topic, detections_topic, stats_topic, status_topic

__all__ = ["MqttPublisher", "Topics", "camera_state_topic", "detections_topic", "encode_payload",
           "stats_topic", "status_topic", "utc_timestamp"]

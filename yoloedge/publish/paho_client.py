"""Building and shutting down the paho client (publish/mqtt.py has the why of the settings).

Why its own module: what paho needs at the start (credentials, TLS, Last Will, the first
back-off) and how its thread is stopped without overrunning a deadline are facts about paho,
not about the publisher's state; the publisher keeps the callbacks it wires in.
"""

from __future__ import annotations

import logging
import threading
import time

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from ..config.schema import MqttConfig
from ..config.tls import client_context
from .inbound import GuardedClient, check_hook

logger = logging.getLogger("yoloedge.publish.mqtt")

#: protocol version used for every connection (see publish/mqtt.py for why).
PROTOCOL = mqtt.MQTTv311


def new_client(cfg: MqttConfig, client_id: str, will_topic: str, will_payload: bytes,
               will_qos: int) -> GuardedClient:
    """The paho client with credentials, TLS, the retained Last Will and the first back-off;
    the caller sets the callbacks."""
    check_hook()
    client = GuardedClient(CallbackAPIVersion.VERSION2, client_id=client_id,
                           clean_session=True, protocol=PROTOCOL)
    if cfg.username is not None:
        client.username_pw_set(cfg.username, cfg.password)
    if cfg.tls is not None:
        client.tls_set_context(client_context(cfg.tls))  # the context `yoloedge check` loaded
    client.will_set(will_topic, will_payload, qos=will_qos, retain=True)
    # the first wait; each failure sets the next one (MqttPublisher._schedule_reconnect)
    client.reconnect_delay_set(cfg.reconnect_min_s, cfg.reconnect_max_s)  # type: ignore[arg-type]
    return client


def shutdown(client: mqtt.Client, deadline: float) -> None:
    """Disconnect and stop paho's thread without overrunning `deadline` (monotonic).

    paho's loop_stop() joins its thread with no timeout, and that thread sleeps up to 1 s at a
    time between reconnect attempts, so it is joined from a helper thread with what is left.
    """
    client.disconnect()
    stopper = threading.Thread(target=client.loop_stop, name="mqtt-loop-stop", daemon=True)
    stopper.start()
    stopper.join(max(0.0, deadline - time.monotonic()))
    if stopper.is_alive():
        # Not connected: the thread only has a back-off sleep to finish, nothing to lose.
        level = logging.WARNING if client.is_connected() else logging.DEBUG
        logger.log(level, "MQTT: network thread still stopping after the stop timeout")
        return
    if client.is_connected():
        # a reconnect raced with disconnect(): say goodbye properly so no Will is sent
        client.disconnect()

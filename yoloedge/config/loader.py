"""Read and validate the daemon's YAML config into the frozen `Config` dataclasses.

`load_config(path, environ)` returns a `Config` or raises one `ConfigError` listing every problem
with its file:line. Loading is pure: it reads the config file, checks that referenced files
(model, labels, TLS) exist and loads the TLS material as the MQTT client will, but never opens a
camera, a device, a socket or the model itself, so
`yoloedge check` and a SIGHUP reload can run it at any time.

Decisions (see the README, Configuration):
  * a section that is absent or null (`mqtt:` with everything commented out) takes its defaults;
  * `accelerators` absent or null means one ONNX Runtime accelerator on the CPU;
  * `cameras` may be empty: the daemon then idles;
  * relative paths (model, labels, TLS files, camera file paths) are taken from the config file's
    folder and stored resolved, because the daemon runs with / as its working directory;
  * camera files and folders are not checked for existence (media may be mounted later).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping

from ..postprocess.layouts import FORMATS
from .accelerators import default_accelerators, read_accelerators
from .cameras import check_camera_accelerators, read_cameras
from .errors import ConfigError, ConfigIssue, IssueLog
from .fields import (INVALID, Boolean, Choice, Context, FilePath, Integer, Number, Text, is_number, is_whole,
                     mapping_or_report, range_order_ok, read_fields, read_string_list, sequence_or_report,
                     show, topic_safe)
from .model import ModelConfig
from .schema import Config, ControlConfig, HealthConfig, LoggingConfig, MqttConfig, TlsConfig
from .tls import TlsMaterialError, client_context
from .yamltree import Item, parse_tree

DEFAULT_PATH = "/etc/yoloedge/yoloedge.yaml"
UNIX_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
#: below these the limits hold less than one typical message burst (see MqttConfig).
MIN_QUEUE_BYTES = 64 * 1024
MIN_SPOOL_BYTES = 1024 * 1024
#: the largest config file read (the example with every key explained is about 10 KiB).
MAX_CONFIG_BYTES = 1024 * 1024


def load_config(path: str, environ: Mapping[str, str]) -> Config:
    """Read `path`, fill ${VAR} references from `environ`, validate, and build the Config."""
    log = IssueLog(path)
    root = parse_tree(_read_text(path), log, environ)
    ctx = Context(log, os.path.dirname(os.path.abspath(path)))
    config = build_config(ctx, root, path)
    log.raise_if_any()
    if config is None:  # every problem that prevents a Config is reported above
        raise ConfigError([ConfigIssue(path, None, None, "", None, "no usable configuration")])
    return config


def _read_text(path: str) -> str:
    """The file as text; at most MAX_CONFIG_BYTES are read, so a wrong path (a log, a device) or a
    huge file cannot fill memory."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError([ConfigIssue(path, None, None, "", None,
                                       f"cannot read the config file: {exc.strerror or exc}")]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError([ConfigIssue(path, None, None, "", None,
                                       f"the file is larger than {MAX_CONFIG_BYTES // 1024 // 1024} MiB; "
                                       f"a configuration is a few kilobytes")])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigIssue(path, None, None, "", None,
                                       f"not a UTF-8 text file (byte {exc.start})")]) from None


# -- top level ---------------------------------------------------------------------------------

TOP_REQUIRED = ("device_id", "model")


def build_config(ctx: Context, root: Item | None, source: str) -> Config | None:
    if root is None:
        ctx.log.add(None, None, "", "the file is empty; it needs at least device_id and model.path")
        return None
    values = read_fields(ctx, root, {
        "device_id": Text(topic_safe=True),
        "model": read_model,
        "accelerators": read_accelerators,
        "cameras": read_cameras,
        "mqtt": read_mqtt,
        "health": read_health,
        "control": read_control,
        "logging": read_logging,
        "shutdown_timeout_s": Number(gt=0, example=10),
    }, required=TOP_REQUIRED)
    if values is None:
        return None
    accelerators_ok = "accelerators" in values or "accelerators" not in root.value
    values.setdefault("accelerators", default_accelerators())
    if accelerators_ok and "cameras" in root.value:
        check_camera_accelerators(ctx, root.value["cameras"], values["accelerators"])
    if any(key not in values for key in TOP_REQUIRED):
        return None
    return Config(source=source, **values)


# -- model -------------------------------------------------------------------------------------

def read_model(ctx: Context, item: Item) -> Any:
    values = read_fields(ctx, item, {
        "path": FilePath(),
        "format": Choice(FORMATS, optional=True),
        "labels": read_labels,
        "conf": Number(ge=0, le=1, example=0.25),
        "iou": Number(ge=0, le=1, example=0.45),
        "max_det": Integer(ge=1, example=300),
        "agnostic_nms": Boolean(optional=True),
        "classes": read_model_classes,
        "class_conf": read_class_conf,
        "imgsz": read_imgsz,
        "anchors": read_anchors,
        "input": Choice(("host", "aipp")),
        "letterbox": Choice(("center", "topleft"), optional=True),
        "color": Choice(("rgb", "bgr"), optional=True),
        "normalize": Boolean(optional=True),
    }, required=("path",))
    if values is None or "path" not in values:
        return INVALID
    return ModelConfig(**values)


def read_labels(ctx: Context, item: Item) -> Any:
    """A labels file, or the labels themselves as a list."""
    if item.value is None or isinstance(item.value, str):
        return FilePath(optional=True)(ctx, item)
    names = read_string_list(ctx, item, "label names")
    return INVALID if names is INVALID else tuple(names)


def read_model_classes(ctx: Context, item: Item) -> Any:
    """Labels or class ids to keep; an empty list would keep nothing, which is never meant."""
    if item.value is None:
        return None
    children = sequence_or_report(ctx, item, "labels or class ids")
    if children is None:
        return INVALID
    if not children:
        return ctx.bad_value(item, "must not be empty (leave it out to keep every class)")
    keys = [child.value if is_class_key(child.value) else ctx.bad_value(child, "must be a label or a class id >= 0")
            for child in children]
    return INVALID if INVALID in keys else tuple(keys)


def is_class_key(value: Any) -> bool:
    """A label ("person") or a class id (0): how classes are named in `classes` and `class_conf`."""
    return (isinstance(value, str) and bool(value.strip())) or (is_whole(value) and value >= 0)


def read_class_conf(ctx: Context, item: Item) -> Any:
    entries = mapping_or_report(ctx, item, optional=True)
    if entries is None:
        return {} if item.value is None else INVALID
    result = {}
    for key, child in entries.items():
        if not is_class_key(key):
            result[key] = ctx.problem(child, f"{show(key)} is not a label or a class id >= 0")
        else:
            result[key] = Number(ge=0, le=1, example=0.5)(ctx, child)
    return INVALID if INVALID in result.values() else result


def read_imgsz(ctx: Context, item: Item) -> Any:
    """N (square) or [H, W]: the input size for models whose input axes are dynamic."""
    value = item.value
    requirement = "must be N or [H, W] (whole numbers >= 1) or null"
    if value is None:
        return None
    if is_whole(value) and value >= 1:
        return (value, value)
    if item.is_sequence and len(value) == 2 and all(is_whole(c.value) and c.value >= 1 for c in value):
        return (value[0].value, value[1].value)
    return ctx.bad_value(item, requirement, "e.g. imgsz: 640 or imgsz: [384, 640]")


def read_anchors(ctx: Context, item: Item) -> Any:
    """Raw-head anchors: one list of w,h pairs per head, flat or as [w, h] pairs."""
    if item.value is None:
        return None
    levels = sequence_or_report(ctx, item, "anchor lists, one per head")
    if levels is None:
        return INVALID
    if not levels:
        return ctx.bad_value(item, "must not be empty (leave it out for the YOLOv5 defaults)")
    parsed = [_anchor_level(ctx, level) for level in levels]
    return INVALID if INVALID in parsed else tuple(parsed)


def _anchor_level(ctx: Context, item: Item) -> Any:
    flat = _flattened(item) if item.is_sequence else []
    if not flat or len(flat) % 2 or not all(is_number(v) and v > 0 for v in flat):
        return ctx.bad_value(item, "must be a list of w,h pairs (numbers > 0)",
                             "e.g. [10,13, 16,30, 33,23] or [[10,13], [16,30], [33,23]]")
    return tuple(float(v) for v in flat)


def _flattened(item: Item) -> list[Any]:
    """[10, 13, 16, 30] and [[10, 13], [16, 30]] both give [10, 13, 16, 30]."""
    flat: list[Any] = []
    for child in item.value:
        if child.is_sequence:
            flat.extend(grandchild.value for grandchild in child.value)
        else:
            flat.append(child.value)
    return flat


# -- mqtt --------------------------------------------------------------------------------------

def read_mqtt(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return MqttConfig()
    values = read_fields(ctx, item, {
        "host": Text(),
        "port": Integer(ge=1, le=65535, example=1883),
        "username": Text(optional=True),
        "password": Text(optional=True, allow_empty=True, secret=True),
        "tls": read_tls,
        "topic_prefix": read_topic_prefix,
        "qos": Integer(ge=0, le=2, example=1),
        "client_id": Text(optional=True),
        "keepalive_s": Integer(ge=1, le=65535, example=30),
        "queue_limit": Integer(ge=1, le=65000, example=10000),
        "queue_limit_bytes": Integer(ge=MIN_QUEUE_BYTES, example=67108864),
        "spool_dir": read_spool_dir,
        "spool_limit_bytes": Integer(ge=MIN_SPOOL_BYTES, example=268435456),
        "stats_interval_s": Number(gt=0, example=10),
        "reconnect_min_s": Number(gt=0, example=1),
        "reconnect_max_s": Number(gt=0, example=30),
    })
    if values is None:
        return INVALID
    if values.get("password") is not None and values.get("username") is None:
        ctx.problem(item.value["password"], "a password needs a username", "add mqtt.username")
        return INVALID
    if not range_order_ok(ctx, item.value, "reconnect_min_s", "reconnect_max_s", values):
        return INVALID
    return MqttConfig(**values)


def read_spool_dir(ctx: Context, item: Item) -> Any:
    """null (no spool), or a directory the daemon can write, or create (as 0700) where its
    nearest existing parent is writable: found now, not at the first outage."""
    if item.value is None:
        return None
    text = Text()(ctx, item)
    if text is INVALID:
        return INVALID
    path = ctx.resolve_path(text)
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            return ctx.problem(item, f"the spool directory {path} is not writable by this user",
                               "make it writable (chown it to the daemon's user), or pick another")
        return path
    if os.path.lexists(path):
        return ctx.problem(item, f"{path} exists and is not a directory",
                           "spool_dir names a directory, e.g. spool_dir: /var/lib/yoloedge/spool")
    parent = os.path.dirname(path)
    while parent != os.path.dirname(parent) and not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        return ctx.problem(item, f"the spool directory {path} does not exist and cannot be created "
                                 f"({parent} is not a writable directory)",
                           "create it for the daemon's user, or pick another")
    return path


def read_tls(ctx: Context, item: Item) -> Any:
    """`true`: TLS with the system's CA certificates; a mapping names CA/client files."""
    if item.value is None or item.value is False:
        return None
    if item.value is True:
        return TlsConfig()
    values = read_fields(ctx, item, {
        "ca_certs": FilePath(optional=True),
        "certfile": FilePath(optional=True),
        "keyfile": FilePath(optional=True),
        "insecure": Boolean(),
    })
    if values is None:
        return INVALID
    if values.get("keyfile") and not values.get("certfile") and "certfile" not in item.value:
        return ctx.problem(item.value["keyfile"], "a keyfile needs a certfile (the client certificate)")
    if len(values) != len(item.value):  # a file already reported missing: nothing to load
        return INVALID
    tls = TlsConfig(**values)
    try:
        client_context(tls)
    except TlsMaterialError as exc:
        return ctx.problem(item.value[exc.key], exc.message)
    return tls


def read_topic_prefix(ctx: Context, item: Item) -> Any:
    prefix = Text()(ctx, item)
    if prefix is INVALID:
        return INVALID
    levels = prefix.split("/")
    if prefix.startswith("$") or any(not level or not topic_safe(level) for level in levels):
        return ctx.bad_value(item, "must be topic levels separated by '/', without '+', '#', spaces, "
                                   "empty levels or a leading '$'", "e.g. topic_prefix: site1/yoloedge")
    return prefix


# -- health, control, logging ------------------------------------------------------------------

def read_health(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return HealthConfig()
    values = read_fields(ctx, item, {
        "stall_timeout_s": Number(gt=0, example=10),
        "watchdog": Boolean(),
        "status_interval_s": Number(gt=0, example=5),
    })
    return INVALID if values is None else HealthConfig(**values)


def read_control(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return ControlConfig()
    values = read_fields(ctx, item, {"socket": read_socket_path, "mode": read_mode})
    return INVALID if values is None else ControlConfig(**values)


def read_socket_path(ctx: Context, item: Item) -> Any:
    path = Text()(ctx, item)
    if path is INVALID:
        return INVALID
    if not path.startswith("/"):
        return ctx.bad_value(item, "must be an absolute path", "e.g. socket: /run/yoloedge/control.sock")
    if len(path.encode()) > UNIX_SOCKET_PATH_MAX:
        return ctx.bad_value(item, f"is longer than {UNIX_SOCKET_PATH_MAX} bytes, the limit for a Unix socket path")
    return path


def read_mode(ctx: Context, item: Item) -> Any:
    """Octal permissions as written: `0660` or `0o660`. A bare `660` would be read as the decimal
    number 660 (0o1224), a silently wrong mode, so the leading 0 is required."""
    text = item.text if item.text is not None else ""
    match = re.fullmatch(r"0o?([0-7]{3})", text)
    if match is None:
        return ctx.bad_value(item, "must be octal permissions with a leading 0, from 0000 to 0777",
                             "e.g. mode: 0660")
    return int(match.group(1), 8)


def read_logging(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return LoggingConfig()
    values = read_fields(ctx, item, {
        "level": Choice(("debug", "info", "warning", "error")),
        "target": Choice(("auto", "journald", "stderr")),
    })
    return INVALID if values is None else LoggingConfig(**values)

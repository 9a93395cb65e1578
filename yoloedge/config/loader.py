"""Read and validate the daemon's YAML config into the frozen `Config` dataclasses.

`load_config(path, environ)` returns a `Config` or raises one `ConfigError` listing every problem
with its file:line. Loading is pure: it reads the config file, checks that referenced files
(model, labels, TLS) exist and loads the TLS material as the MQTT client will, but never opens a
camera, a device, a socket or the model itself, so
`yoloedge check` and a SIGHUP reload can run it at any time.

Decisions (see docs/operations/checking-config.md):
  * a section that is absent or null (`mqtt:` with everything commented out) takes its defaults;
  * `accelerators` absent or null means one ONNX Runtime accelerator on the CPU;
  * `cameras` may be empty: the daemon then idles;
  * relative paths (models, labels, TLS files, camera file paths) are taken from the config file's
    folder and stored resolved, because the daemon runs with / as its working directory;
  * one `model:` or a list of `models:` (config.models), never both; a single `model:` is named
    after its file's stem;
  * camera files and folders are not checked for existence (media may be mounted later).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import stat
from typing import Any, Mapping

from ..files import FileProblem, file_type, read_bounded
from ..redact import SECRETS
from ..spooldir import directory_problem as spool_directory_problem
from .accelerators import check_model_file_kind, default_accelerators, read_accelerators
from .cameras import check_camera_accelerators, read_cameras
from .errors import ConfigError, ConfigIssue, IssueLog
from .fields import (INVALID, MAX_NAME_BYTES, Boolean, Choice, Context, Key, FilePath, Integer, Number,
                     Text, range_order_ok, read_fields, topic_safe)
from .http import read_http
from .location import daemon_socket
from .model import ModelConfig
from .modelrefs import check_camera_decoders, check_camera_labels, check_model_references
from .models import MAX_MODELS, path_key, read_model, read_models, take_models
from .schema import (AcceleratorConfig, Config, ControlConfig, HealthConfig, HomeAssistantConfig, LoggingConfig,
                     MqttConfig, TlsConfig, TrackingConfig)
from .tls import TlsMaterialError, client_context
from .tracking import merge_cameras as merge_camera_tracking
from .tracking import read_tracking
from .yamltree import Item, parse_tree

DEFAULT_PATH = "/etc/yoloedge/yoloedge.yaml"
UNIX_SOCKET_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
#: below these the limits hold less than one typical message burst (see MqttConfig).
MIN_QUEUE_BYTES = 64 * 1024
MIN_SPOOL_BYTES = 1024 * 1024
#: the largest config file read (the example with every key explained is about 10 KiB).
MAX_CONFIG_BYTES = 1024 * 1024
#: the longest wait any timeout, interval or backoff key takes: an hour is already far past any
#: sensible value, and OpenCV, paho and threading all take it without overflow.
MAX_WAIT_S = 3600
#: bounds of the MQTT outbox: in memory (an edge box has a few GiB), and on disk.
MAX_QUEUE_BYTES = 1024 ** 3
MAX_SPOOL_BYTES = 1024 ** 4
#: the fastest paced drain of the MQTT backlog, in messages a second (0 means unpaced).
MAX_DRAIN_RATE = 100_000
#: the longest topic prefix; with device_id and a camera name (MAX_NAME_BYTES each) a topic stays
#: far below MQTT's 65,535 bytes.
MAX_TOPIC_PREFIX_BYTES = 256


def load_config(path: str, environ: Mapping[str, str]) -> Config:
    """Read `path`, fill ${VAR} references from `environ`, validate, and build the Config."""
    log = IssueLog(path)
    root = parse_tree(_read_text(path), log, environ)
    ctx = Context(log, os.path.dirname(os.path.abspath(path)))
    config = build_config(ctx, root, path)
    log.raise_if_any()
    if config is None:  # every problem that prevents a Config is reported above
        raise ConfigError([ConfigIssue(path, None, None, "", None, "no usable configuration")])
    return with_default_socket(config, root, environ)


def with_default_socket(config: Config, root: Item | None, environ: Mapping[str, str]) -> Config:
    """`config` with the socket `config.location.daemon_socket` picks where the file does not set
    `control.socket`: a normal user's daemon cannot create the system one."""
    control = root.value.get("control") if root is not None and isinstance(root.value, dict) else None
    if control is not None and isinstance(control.value, dict) and "socket" in control.value:
        return config
    socket_path = daemon_socket(environ)
    if socket_path == config.control.socket:
        return config
    return dataclasses.replace(config, control=dataclasses.replace(config.control, socket=socket_path))


def _read_text(path: str) -> str:
    """The file as text. `files.read_bounded`: a FIFO put in its place is refused, not waited on
    (a reload or SIGTERM would hang), and a wrong path (a log, a device) or a huge file cannot fill
    memory."""
    return read_text_file(path, MAX_CONFIG_BYTES, "the config file", "a configuration is a few kilobytes")


def read_text_file(path: str, max_bytes: int, what: str, typical: str) -> str:
    """A small UTF-8 file that configures the daemon (the config, an env file), or a ConfigError
    naming the file: missing, not a regular file, over `max_bytes`, or not UTF-8 text."""
    try:
        data = read_bounded(path, max_bytes)
    except FileProblem as exc:
        reason = (f"the file is larger than {_size(max_bytes)}; {typical}" if exc.too_large
                  else f"cannot read {what}: {exc.reason}")
        raise ConfigError([ConfigIssue(path, None, None, "", None, reason)]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigIssue(path, None, None, "", None,
                                       f"not a UTF-8 text file (byte {exc.start})")]) from None


def _size(count: int) -> str:
    return f"{count // 1024 // 1024} MiB" if count >= 1024 * 1024 else f"{count // 1024} KiB"


# -- top level ---------------------------------------------------------------------------------

def build_config(ctx: Context, root: Item | None, source: str) -> Config | None:
    if root is None:
        ctx.log.add(None, None, "", "the file is empty; it needs at least device_id and model.path (or models:)")
        return None
    values = read_fields(ctx, root, TOP_FIELDS, required=("device_id",))
    if values is None:
        return None
    models = take_models(ctx, root, values)
    accelerators_ok = "accelerators" in values or "accelerators" not in root.value
    values.setdefault("accelerators", default_accelerators())
    groups = values["accelerators"] if accelerators_ok else None
    if groups is not None and "cameras" in root.value:
        check_camera_accelerators(ctx, root.value["cameras"], groups)
    check_model_references(ctx, root, groups)
    check_camera_decoders(ctx, root, groups)
    if models is not None:
        check_models_against_groups(ctx, root, models, groups)
    if values.get("cameras") and ("tracking" in values or "tracking" not in root.value):
        values["cameras"] = merge_camera_tracking(ctx, root.value["cameras"], values["cameras"],
                                                  values.get("tracking", TrackingConfig()))
    if "device_id" not in values or models is None or values.get("cameras") is INVALID:
        return None
    return Config(source=source, model=models[0], models=models, **values)


def check_models_against_groups(ctx: Context, root: Item, models: tuple[ModelConfig, ...],
                                groups: tuple[AcceleratorConfig, ...] | None) -> None:
    """What needs the models read: each camera's labels against its own models' labels, and each
    group's model files against its backend."""
    if groups is None:
        return
    if "cameras" in root.value:
        check_camera_labels(ctx, root, models, groups)
    if "accelerators" in root.value:
        check_model_file_kind(ctx, root.value["accelerators"], groups, models,
                              [path_key(root, index) for index in range(len(models))])


# -- mqtt --------------------------------------------------------------------------------------

def read_mqtt(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return MqttConfig()
    values = read_fields(ctx, item, MQTT_FIELDS)
    if values is None:
        return INVALID
    if values.get("password") is not None and values.get("username") is None:
        ctx.problem(item.value["password"], "a password needs a username", "add mqtt.username")
        return INVALID
    if not range_order_ok(ctx, item.value, "reconnect_min_s", "reconnect_max_s", values):
        return INVALID
    return MqttConfig(**values)


def read_homeassistant(ctx: Context, item: Item) -> Any:
    """`true`: Home Assistant discovery under HA's default prefix; a mapping names the prefix;
    `false` or null: off."""
    if item.value is None or item.value is False:
        return None
    if item.value is True:
        return HomeAssistantConfig()
    if not item.is_mapping:
        return ctx.bad_value(item, "must be true, false or a mapping with discovery_prefix",
                             "e.g. homeassistant: true, or homeassistant: {discovery_prefix: homeassistant}")
    values = read_fields(ctx, item, HOMEASSISTANT_FIELDS)
    return INVALID if values is None else HomeAssistantConfig(**values)


#: a host name (RFC 1123 labels; '_' too, as some internal DNS zones have it), which an IPv4
#: address also is; IPv6 addresses are read by `ipaddress`.
_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                        r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


def read_mqtt_host(ctx: Context, item: Item) -> Any:
    """A host name, an IPv4 address or an IPv6 address (bracketed or not; returned without the
    brackets, the form a socket takes). Nothing else: `admin:pw@broker` or `mqtt://u:p@broker`
    would otherwise be quoted on every connection attempt and in the status. A refused value is
    registered as a secret before it is reported, and the message never quotes it: it may hold a
    password in any shape (`broker/psw=...`)."""
    value = item.value
    refused = isinstance(value, str) and _host_address(value) is None
    if refused:  # before any message: even a message that does not quote it is logged next to others
        SECRETS.add_url(value if "://" in value else "mqtt://" + value.lstrip("/"))
    value = Text(secret=refused)(ctx, item)  # a string, not empty, not too long; registers it if refused
    if value is INVALID or not refused:
        return value if value is INVALID else _host_address(value)
    if "@" in value or "://" in value:
        hint = ("put the user name in mqtt.username and the password in mqtt.password "
                "(e.g. from ${MQTT_PASSWORD}), and the port in mqtt.port")
    else:
        hint = "e.g. host: broker.lan, 192.0.2.10 or '[2001:db8::1]'; the port goes in mqtt.port"
    return ctx.problem(item, "must be a host name or address, not a URL (with a user name, password, "
                             "port or path); not repeated here, as it may hold a password", hint)


def _host_address(text: str) -> str | None:
    """`text` as a socket takes it when it is a host name or an IP address (IPv6 without its
    brackets); None for anything else."""
    if _HOST_NAME.fullmatch(text):
        return text
    address = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return None
    return address


def read_spool_dir(ctx: Context, item: Item) -> Any:
    """null (no spool), or a directory of the spool's own (`yoloedge.spooldir`: no symlink, no
    system directory, no other files in it) that the daemon can write, or create (as 0700) where
    its nearest existing parent is writable: found now, not at the first outage. Run as root,
    `check` cannot know the service's user, so the directory's owner is then left to the spool."""
    if item.value is None:
        return None
    text = Text()(ctx, item)
    if text is INVALID:
        return INVALID
    path = ctx.resolve_path(text)
    problem = spool_directory_problem(path, check_owner=os.geteuid() != 0)
    if problem is not None:
        return ctx.problem(item, f"spool directory refused: {problem.message}", problem.fix)
    if os.path.isdir(path):
        if not os.access(path, os.W_OK | os.X_OK):
            return ctx.problem(item, f"the spool directory {path} is not writable by this user",
                               "make it writable (chown it to the daemon's user), or pick another")
        return path
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
    values = read_fields(ctx, item, TLS_FIELDS)
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
    prefix = Text(max_bytes=MAX_TOPIC_PREFIX_BYTES)(ctx, item)
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
    values = read_fields(ctx, item, HEALTH_FIELDS)
    return INVALID if values is None else HealthConfig(**values)


def read_control(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return ControlConfig()
    values = read_fields(ctx, item, CONTROL_FIELDS)
    return INVALID if values is None else ControlConfig(**values)


def read_socket_path(ctx: Context, item: Item) -> Any:
    path = Text()(ctx, item)
    if path is INVALID:
        return INVALID
    if not path.startswith("/"):
        return ctx.bad_value(item, "must be an absolute path", "e.g. socket: /run/yoloedge/control.sock")
    if len(path.encode()) > UNIX_SOCKET_PATH_MAX:
        return ctx.bad_value(item, f"is longer than {UNIX_SOCKET_PATH_MAX} bytes, the limit for a Unix socket path")
    problem = socket_path_problem(path)
    if problem is not None:
        return ctx.problem(item, problem, "remove it, or pick another path, e.g. socket: /run/yoloedge/control.sock")
    return path


def socket_path_problem(path: str) -> str | None:
    """Why the daemon could not create its control socket at `path`: something other than a socket
    (a left-over socket is replaced) is in the way. Without the check the daemon would start without
    its control socket, and `yoloedge-ctl` could not reach it. A path that cannot be looked at (a
    folder on it is a file, no permission) is left to the daemon, which refuses to start when it
    cannot create its instance lock there."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if stat.S_ISSOCK(info.st_mode):
        return None
    return f"{path} exists and is not a socket ({file_type(info.st_mode)})"


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
    values = read_fields(ctx, item, LOGGING_FIELDS)
    return INVALID if values is None else LoggingConfig(**values)


# -- the keys of each section: reader and meaning (see `fields.Key`), after the readers they name --

TOP_FIELDS: dict[str, Key] = {
    "device_id": Key(Text(topic_safe=True, max_bytes=MAX_NAME_BYTES),
                     "this box's name; second level of every topic",
                     default="required"),
    "model": Key(read_model,
                 "the model, below; named after its file's stem unless it has a `name`",
                 type="mapping",
                 default="required, or `models`"),
    "models": Key(read_models,
                  "several models at once, instead of `model`: each a mapping with the keys of `model` (see "
                  "[Several models](#several-models))",
                  type=f"non-empty list of mappings, at most {MAX_MODELS}, names unique",
                  default="required, or `model`"),
    "accelerators": Key(read_accelerators,
                        "groups of devices running the models",
                        type="list",
                        default="one ONNX Runtime CPU accelerator named `onnxruntime0`"),
    "cameras": Key(read_cameras,
                   "sources; an empty list is allowed (the daemon idles)",
                   type="list"),
    "mqtt": Key(read_mqtt,
                "broker connection and topics",
                type="mapping",
                default="defaults below"),
    "health": Key(read_health,
                  "stall detection and systemd watchdog",
                  type="mapping",
                  default="defaults below"),
    "control": Key(read_control,
                   "`yoloedge-ctl` socket",
                   type="mapping",
                   default="defaults below"),
    "logging": Key(read_logging,
                   "log level and destination",
                   type="mapping",
                   default="defaults below"),
    "http": Key(read_http,
                "HTTP endpoint (`/metrics`, `/api/status`); null: off",
                type="mapping or null",
                default="listen on `127.0.0.1:8480`"),
    "tracking": Key(read_tracking,
                    "tracking defaults for every camera (see [Tracking](integrations/tracking.md))",
                    type="mapping or null",
                    default="defaults below"),
    "shutdown_timeout_s": Key(Number(gt=0, le=MAX_WAIT_S, example=10),
                              "seconds to drain queued frames on stop"),
}


MQTT_FIELDS: dict[str, Key] = {
    "host": Key(read_mqtt_host,
                "broker",
                type="string"),
    "port": Key(Integer(ge=1, le=65535, example=1883),
                "broker port (8883 is the usual one for TLS)"),
    "username": Key(Text(optional=True),
                    "null: anonymous"),
    "password": Key(Text(optional=True, allow_empty=True, secret=True),
                    "needs `username`; use `${MQTT_PASSWORD}`"),
    "tls": Key(read_tls,
               "true: TLS with the system CAs; mapping: `ca_certs`, `certfile`, `keyfile` (files must exist; "
               "`keyfile` needs `certfile`), `insecure` (bool, default false: skip host name check)",
               type="null/false, true, or mapping"),
    "topic_prefix": Key(read_topic_prefix,
                        "first topic level(s); `/`-separated, no `+`, `#`, empty levels or leading `$`",
                        type=f"string, <= {MAX_TOPIC_PREFIX_BYTES} bytes"),
    "qos": Key(Integer(ge=0, le=2, example=1),
               "MQTT quality of service of the messages published"),
    "client_id": Key(Text(optional=True, max_bytes=MAX_NAME_BYTES),
                     "null: `yoloedge-<device_id>`"),
    "keepalive_s": Key(Integer(ge=1, le=65535, example=30),
                       "also how long to wait for the broker's CONNACK after connecting"),
    "queue_limit": Key(Integer(ge=1, le=65000, example=10000),
                       "messages held in memory while the broker is down (or not yet acknowledged); beyond that "
                       "dropped and counted"),
    "queue_limit_bytes": Key(Integer(ge=MIN_QUEUE_BYTES, le=MAX_QUEUE_BYTES, example=67108864),
                             "the same bound in payload bytes; whichever is reached first applies",
                             default="`67108864` (64 MiB)"),
    "spool_dir": Key(read_spool_dir,
                     "null: queue in memory only. A directory of its own (created 0700; must be writable or "
                     "creatable) for the durable outbox: messages survive a restart during an outage. Under the "
                     "shipped unit use `/var/lib/yoloedge/spool` (inside its `StateDirectory`). Refused (exit 78): "
                     "a directory holding anything but the spool's own files, a system directory (`/`, `/etc`, "
                     "`/var/lib`, `/tmp`, the service's own `/var/lib/yoloedge` ...), a symlink, one writable by "
                     "every user, or one owned by another user (see [The spool directory]"
                     "(integrations/mqtt.md#the-spool-directory))",
                     type="path or null"),
    "spool_limit_bytes": Key(Integer(ge=MIN_SPOOL_BYTES, le=MAX_SPOOL_BYTES, example=268435456),
                             "most disk space for `spool_dir`; beyond it the oldest messages are deleted and "
                             "counted as dropped",
                             default="`268435456` (256 MiB)"),
    "stats_interval_s": Key(Number(gt=0, le=MAX_WAIT_S, example=10),
                            "seconds between stats messages"),
    "reconnect_min_s": Key(Number(gt=0, le=MAX_WAIT_S, example=1),
                           "first reconnect delay"),
    "reconnect_max_s": Key(Number(gt=0, le=MAX_WAIT_S, example=30),
                           "longest reconnect delay (delays double from `reconnect_min_s`, spread by ±20 % jitter "
                           "like cameras' backoff)"),
    "drain_rate": Key(Number(ge=0, le=MAX_DRAIN_RATE, example=100),
                      "after a reconnect, the messages that waited (the outage's queue, the spool of the last run) "
                      "go out at most this many a second, one second's worth at once; new messages and the newest "
                      "retained state go out at once. 0: as fast as the broker takes them"),
    "homeassistant": Key(read_homeassistant,
                         "Home Assistant MQTT discovery (see \"Home Assistant\"); `true` uses the prefix "
                         "`homeassistant`",
                         type="`true`, `false`, null or a mapping",
                         default="`false`"),
}


HOMEASSISTANT_FIELDS: dict[str, Key] = {
    "discovery_prefix": Key(read_topic_prefix,
                            "must match the discovery prefix set in Home Assistant's MQTT integration",
                            type="topic levels without `+`, `#`"),
}


TLS_FIELDS: dict[str, Key] = {
    "ca_certs": Key(FilePath(optional=True),
                    "CA certificates to verify the broker with; null: the system's"),
    "certfile": Key(FilePath(optional=True),
                    "client certificate (for brokers that authenticate clients by certificate)"),
    "keyfile": Key(FilePath(optional=True),
                   "the client certificate's private key; null: it is in `certfile`"),
    "insecure": Key(Boolean(),
                    "skip the broker's hostname verification (testing only)"),
}


HEALTH_FIELDS: dict[str, Key] = {
    "stall_timeout_s": Key(Number(gt=0, le=MAX_WAIT_S, example=10),
                           "no good frame this long: the camera is stalled and reconnected"),
    "watchdog": Key(Boolean(),
                    "send `WATCHDOG=1` to systemd (with `WatchdogSec=`) while at least one device makes progress"),
    "status_interval_s": Key(Number(gt=0, le=MAX_WAIT_S, example=5),
                             "seconds between status updates to systemd"),
}


CONTROL_FIELDS: dict[str, Key] = {
    "socket": Key(read_socket_path,
                  "`yoloedge-ctl` Unix socket; a file in its place that is not a socket is an error. Not set: a "
                  "daemon that cannot create `/run/yoloedge` (a normal user's) uses "
                  "`$XDG_RUNTIME_DIR/yoloedge/control.sock`; set explicitly, the path is used as is",
                  type=f"absolute path, <= {UNIX_SOCKET_PATH_MAX} bytes"),
    "mode": Key(read_mode,
                "socket permissions (`660` without the 0 is refused: YAML reads it as decimal)",
                type="octal with leading 0",
                default="`0660`"),
}


LOGGING_FIELDS: dict[str, Key] = {
    "level": Key(Choice(("debug", "info", "warning", "error")),
                 "the lowest level logged"),
    "target": Key(Choice(("auto", "journald", "stderr")),
                  "auto: the journal under systemd, else stderr"),
}

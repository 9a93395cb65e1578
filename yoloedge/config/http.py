"""The `http:` section: where the daemon's HTTP endpoint listens, and who may use it.

`http: null` (or `listen: null`) turns the endpoint off; an absent section listens on
127.0.0.1:8480. Only loopback is accepted unless `allow_remote: true` says otherwise by name: the
endpoint shows camera names, states and the network layout, and an address typed by habit
(`0.0.0.0`) must not publish that to the whole network. Hosts are IP addresses (or `localhost`):
the loader never resolves names, and whether a listener is loopback must be known here.

`allowed_hosts` names the Host headers answered besides loopback names and the listen address
(DNS rebinding, see `web.access`): names and addresses, no ports, compared as `web.access`
compares them (`normal_host`, here), so what is checked here is what is matched there.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from .fields import INVALID, Boolean, Context, Key, Text, read_fields, sequence_or_report
from .schema import HttpConfig
from .yamltree import Item

LISTEN_EXAMPLE = "e.g. listen: 127.0.0.1:8480, '[::1]:8480', or null to turn the endpoint off"
ALLOWED_HOSTS_EXAMPLE = "e.g. allowed_hosts: [edge1.lan, 192.0.2.7]"
#: the most names `allowed_hosts` takes: a box is reached by a few names, not by hundreds
MAX_ALLOWED_HOSTS = 64
_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?")
_LISTEN = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]+)):(?P<port>[0-9]{1,5})")


def read_http(ctx: Context, item: Item) -> Any:
    if item.value is None:
        return HttpConfig(listen=None)
    values = read_fields(ctx, item, HTTP_FIELDS)
    if values is None:
        return INVALID
    entries = item.value
    if values.get("password") is not None and values.get("username") is None:
        return ctx.problem(entries["password"], "a password needs a username", "add http.username")
    if values.get("username") is not None and values.get("password") is None and "password" not in entries:
        return ctx.problem(entries["username"], "a username needs a password",
                           "add http.password, e.g. password: ${YOLOEDGE_HTTP_PASSWORD}")
    listen = values.get("listen", HttpConfig.listen)
    if listen is not None and not is_loopback(listen[0]) and not values.get("allow_remote", False):
        return ctx.problem(entries.get("listen", item), f"{listen[0]} is not a loopback address: the endpoint would "
                                                        f"be reachable from the network",
                           "add http.allow_remote: true (and http.username/password), or listen on 127.0.0.1")
    return HttpConfig(**values)


def read_listen(ctx: Context, item: Item) -> Any:
    """HOST:PORT, IPv6 in brackets; the address as a socket takes it (no brackets)."""
    value = item.value
    if value is None:
        return None
    match = _LISTEN.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return ctx.bad_value(item, "must be HOST:PORT or null", LISTEN_EXAMPLE)
    host = match.group("v6") or match.group("host")
    if host != "localhost" and not _is_address(host, v6=bool(match.group("v6"))):
        return ctx.bad_value(item, "must have an IP address (or localhost) as its host; names are not resolved",
                             LISTEN_EXAMPLE)
    port = int(match.group("port"))
    if not 1 <= port <= 65535:
        return ctx.bad_value(item, "must have a port from 1 to 65535", LISTEN_EXAMPLE)
    return (host, port)


def read_allowed_hosts(ctx: Context, item: Item) -> Any:
    """A list of host names or IP addresses (IPv6 with or without brackets), without ports; null
    or [] for none. Stored in the form Host headers are compared in."""
    if item.value is None:
        return ()
    children = sequence_or_report(ctx, item, "host names", MAX_ALLOWED_HOSTS)
    if children is None:
        return INVALID
    hosts = []
    for child in children:
        text = Text(max_bytes=255)(ctx, child)
        if text is INVALID:
            hosts.append(INVALID)
            continue
        host = normal_host(text.strip())
        if host is None:
            with_port = re.fullmatch(r"(.+):[0-9]+", text.strip())
            hint = ("leave out the port: it is not compared" if with_port and normal_host(with_port.group(1))
                    else ALLOWED_HOSTS_EXAMPLE)
            hosts.append(ctx.bad_value(child, "must be a host name or an IP address, without a port", hint))
            continue
        hosts.append(host)
    return INVALID if INVALID in hosts else tuple(dict.fromkeys(hosts))


def _is_address(host: str, v6: bool) -> bool:
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == (6 if v6 else 4)  # an IPv6 address needs its brackets


def is_loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def normal_host(text: str) -> str | None:
    """A host without a port (`name`, `192.0.2.7`, `::1`, `[::1]`) as `web.access` compares it, or None
    when it is not one."""
    if text.startswith("[") and text.endswith("]"):
        return normal_ipv6(text[1:-1])
    return normal_ipv6(text) if ":" in text else normal_name(text)


def normal_ipv6(text: str) -> str | None:
    """An IPv6 address in its compressed form, or None when it is not one."""
    try:
        return ipaddress.IPv6Address(text).compressed
    except ValueError:
        return None


def normal_name(name: str) -> str | None:
    """A host name or IPv4 address as `web.access` compares it, or None when it is neither."""
    name = name[:-1] if name.endswith(".") else name
    if len(name) > 253 or not _NAME.fullmatch(name) or ".." in name:
        return None
    return name.lower()


#: the keys of `http:`: reader and meaning (see `fields.Key`).
HTTP_FIELDS: dict[str, Key] = {
    "listen": Key(read_listen,
                  "where `/metrics` and `/api/status` are served; null: off",
                  type="`HOST:PORT` (an IP address or `localhost`; IPv6 in brackets) or null",
                  default="`127.0.0.1:8480`"),
    "allow_remote": Key(Boolean(),
                        "must be `true` for a `listen` that is not loopback (`0.0.0.0:8480`)"),
    "allowed_hosts": Key(read_allowed_hosts,
                         "`Host` names answered besides loopback ones (`localhost`, `*.localhost`, `127.x.x.x`, "
                         "`[::1]`) and the listen address; any other gets 421. Empty: loopback only, or any name "
                         "under `allow_remote`",
                         type=f"list of host names or IP addresses (no ports; at most {MAX_ALLOWED_HOSTS}), or null"),
    "username": Key(Text(optional=True),
                    "basic auth user; needs `http.password`"),
    "password": Key(Text(optional=True, secret=True),
                    "basic auth password; never logged or shown in status"),
}

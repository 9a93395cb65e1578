"""Who the HTTP endpoint answers: by which names it may be reached (`HostPolicy`), and how fast
it answers wrong passwords (`AuthThrottle`).

DNS rebinding: a page from `http://evil.example` makes its own name resolve to 127.0.0.1 and
then reads `http://evil.example:8480/api/cameras/gate/latest.jpg`, which the browser counts as
the same origin; it works from a browser on the box, and from a workstation with an
`ssh -L 8480:127.0.0.1:8480` tunnel. Such a request says `Host: evil.example:8480`, so the
endpoint answers only the names it is meant for and says 421 Misdirected Request to the rest:
loopback names and literals (`localhost`, `*.localhost`, 127.0.0.0/8, `[::1]`: nobody outside can
make a browser use them for its own page), the listen address, and `http.allowed_hosts`. Under
`allow_remote` with no `allowed_hosts`, any name is answered, as before (a scraper reaches the
box by whatever name or address it knows). The port is not compared: behind a tunnel or a proxy
it differs, and a rebinding page cannot choose the name, which is what counts. An HTTP/1.1
request without Host, or with two, is 400 (RFC 9112, 3.2); HTTP/1.0 may omit it (no browser
does).

Guessing passwords: each client (an IPv4 address, an IPv6 /64) that sends wrong credentials
gets its 401 only after a delay that doubles with every failure in a row, from AUTH_DELAY_FIRST_S
to AUTH_DELAY_MAX_S. Credentials it sends before that delay is over are not checked at all; the
request gets its 401 when the delay ends. A client that waits for each answer (a person, a
misconfigured scraper) is never refused a right password, one that sends many in parallel gets
one guess per delay. The delayed answer is scheduled by the server (`Response.delay_s`): no
thread waits for it. At most AUTH_MAX_CLIENTS clients are remembered (the one that failed least
recently is forgotten first), each for AUTH_FORGET_AFTER_S after its last failure; a right
password forgets it at once.

Lock order: `AuthThrottle._lock` is a leaf (nothing is called while it is held).
"""

from __future__ import annotations

import collections
import ipaddress
import re
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Callable, Iterable

from ..backoff import Backoff
from ..config.http import normal_host, normal_ipv6, normal_name

Clock = Callable[[], float]

AUTH_DELAY_FIRST_S = 0.25
AUTH_DELAY_MAX_S = 8.0
AUTH_MAX_CLIENTS = 1024
AUTH_FORGET_AFTER_S = 600.0
#: the prefix length that counts as one IPv6 client (a host can have any address in its /64)
IPV6_CLIENT_PREFIX = 64

_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[^:\[\]]+))(?::(?P<port>[0-9]{0,5}))?")
_UNSPECIFIED = ("0.0.0.0", "::")


def host_of(value: str) -> str | None:
    """The host of a Host header (`name`, `name:port`, `[v6]:port`), lower case, without a
    trailing dot, IP addresses in their usual form; None when it is not a host."""
    match = _HOST.fullmatch(value)
    if match is None:
        return None
    if match.group("v6") is not None:
        return normal_ipv6(match.group("v6"))
    return normal_name(match.group("name"))


def is_loopback_host(host: str) -> bool:
    """`localhost`, a name under `.localhost` (RFC 6761: never resolved through DNS), or a
    loopback address (127.0.0.0/8, ::1, ::ffff:127.x.x.x)."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


class HostPolicy:
    """Which Host headers are answered (see the module docstring). `any_host`: every well-formed one."""

    def __init__(self, listen_host: str | None, allowed: Iterable[str] = (), any_host: bool = False):
        names = {normal_host(h) for h in allowed}
        if listen_host is not None and listen_host not in _UNSPECIFIED:
            names.add(normal_host(listen_host))
        self._names = frozenset(n for n in names if n is not None)
        self._any = any_host

    def refusal(self, version: str, host: str | None) -> HTTPStatus | None:
        """None when a request of this HTTP `version` with this Host header (None: none) is
        answered; else the status it gets."""
        if host is None:
            return HTTPStatus.BAD_REQUEST if version != "HTTP/1.0" else None
        name = host_of(host)
        if name is None:
            return HTTPStatus.BAD_REQUEST
        if self._any or name in self._names or is_loopback_host(name):
            return None
        return HTTPStatus.MISDIRECTED_REQUEST


@dataclass
class _Client:
    backoff: Backoff
    until: float = 0.0  # its requests are not checked before this (clock)
    last_failure: float = 0.0


class AuthThrottle:
    """Per-client delays after failed basic auth (see the module docstring); thread-safe."""

    def __init__(self, clock: Clock = time.monotonic, max_clients: int = AUTH_MAX_CLIENTS):
        self._clock = clock
        self._max_clients = max_clients
        self._lock = threading.Lock()
        self._clients: collections.OrderedDict[str, _Client] = collections.OrderedDict()  # oldest failure first

    def wait_s(self, client: str) -> float:
        """How long before this client's credentials are checked again (0: now)."""
        now = self._clock()
        with self._lock:
            entry = self._clients.get(client_key(client))
            return 0.0 if entry is None else max(0.0, entry.until - now)

    def failed(self, client: str) -> float:
        """A wrong password from `client`: how long its 401 waits."""
        now = self._clock()
        key = client_key(client)
        with self._lock:
            self._forget_old(now)
            entry = self._clients.pop(key, None)
            if entry is None:
                entry = _Client(Backoff(AUTH_DELAY_FIRST_S, AUTH_DELAY_MAX_S))
                while len(self._clients) >= self._max_clients:
                    self._clients.popitem(last=False)
            delay = entry.backoff.next_delay()
            entry.until, entry.last_failure = now + delay, now
            self._clients[key] = entry  # now the most recent
            return delay

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._clients.pop(client_key(client), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    def _forget_old(self, now: float) -> None:
        while self._clients:
            oldest = next(iter(self._clients.values()))
            if now - oldest.last_failure < AUTH_FORGET_AFTER_S:
                return
            self._clients.popitem(last=False)


def client_key(client: str) -> str:
    """An IPv4 address as it is, an IPv6 address as its /64 (a v4-mapped one as the IPv4 address)."""
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return client
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, IPV6_CLIENT_PREFIX), strict=False))
    return str(address)

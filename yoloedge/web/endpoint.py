"""The daemon's HTTP endpoint across its life: started with the daemon, changed by a reload.

A reload that changes only the credentials or the allowed host names swaps them on the running
server; one that changes
the address binds the new one, and when that fails binds the old one again and raises, so the
daemon rejects the reload as it does any other that cannot be applied.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from urllib.parse import parse_qs, unquote
from typing import Callable

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from ..config.schema import HttpConfig
from ..control.protocol import encode
from ..events.recent import EventLog, events_reply, valid_event_id
from ..pipeline.snapshots import SnapshotStore
from .access import HostPolicy
from .metrics import Meters, new_registry
from .page import icon, status_page
from .server import BasicAuth, HttpServer, Request, Response, Router, text_response

log = logging.getLogger(__name__)


class HttpBindError(RuntimeError):
    """The new address could not be bound; the old one serves again."""


#: where each camera's latest annotated frame is served: CAMERA_IMAGES + <name> + LATEST_JPEG.
CAMERA_IMAGES = "/api/cameras/"
LATEST_JPEG = "/latest.jpg"
#: the recent events (JSON), and each one's best shot: EVENTS + "/" + <id> + SNAPSHOT_JPEG
EVENTS = "/api/events"
SNAPSHOT_JPEG = "/snapshot.jpg"
#: what `GET /api/events` takes in its query string
EVENTS_QUERY = ("camera", "limit")


class HttpEndpoint:
    def __init__(self, status: Callable[[], dict], meters: Callable[[], Meters],
                 snapshots: SnapshotStore | None = None, events: EventLog | None = None):
        self._status = status
        self._snapshots = snapshots
        self._events = events
        self.registry = new_registry(meters)
        self.router = Router()
        self.router.add("/metrics", self._metrics)
        self.router.add("/api/status", self._api_status)
        self.router.add_prefix(CAMERA_IMAGES, self._camera_image)
        self.router.add(EVENTS, self._api_events)
        self.router.add_prefix(EVENTS + "/", self._event_snapshot)
        self.router.add("/", status_page)  # the status page and its icon (web.page)
        self.router.add("/favicon.ico", icon)
        self.config: HttpConfig | None = None
        self.server: HttpServer | None = None

    def start(self, config: HttpConfig) -> None:
        """Listen as `config` says; raises OSError when the address cannot be bound."""
        self.config = config
        self.router.auth, self.router.hosts = _auth(config), _hosts(config)
        if config.listen is None:
            return
        host, port = config.listen
        server = HttpServer(host, port, self.router)
        server.start()
        self.server = server
        shown = f"[{host}]" if ":" in host else host
        log.info("HTTP endpoint on http://%s:%d (/, /metrics, /api/status, /api/events)%s", shown, server.address[1],
                 ", basic auth" if self.router.auth else "")

    def apply(self, new: HttpConfig) -> None:
        """A reload's new settings; raises HttpBindError (after binding the old address again)
        when the new address cannot be bound."""
        old = self.config
        if old is not None and new.listen == old.listen and (self.server is not None or new.listen is None):
            self.config = new
            self.router.auth, self.router.hosts = _auth(new), _hosts(new)
            return
        self.stop()
        try:
            self.start(new)
        except OSError as exc:
            if old is not None:
                self._restart(old)
            raise HttpBindError(f"http.listen: cannot listen on {listen_text(new)}: {exc.strerror or exc}") from None
        if old is not None and old.listen != new.listen:
            log.info("reload: HTTP endpoint moved from %s to %s", listen_text(old), listen_text(new))

    def _restart(self, config: HttpConfig) -> None:
        try:
            self.start(config)
        except OSError as exc:  # its port was taken meanwhile: the daemon runs on without it
            log.error("HTTP endpoint: cannot listen on %s again: %s", listen_text(config), exc)
            self.server = None

    def _camera_image(self, request: Request) -> Response:
        """The camera's latest processed frame with its boxes drawn, encoded now (never per frame):
        404 for a camera that does not exist, 503 until its first frame is published."""
        name = unquote(request.path[len(CAMERA_IMAGES):-len(LATEST_JPEG)]) if request.path.endswith(LATEST_JPEG) else ""
        store = self._snapshots
        if not name or store is None or not store.known(name):
            return text_response(HTTPStatus.NOT_FOUND, "no such camera")
        jpeg = store.latest_jpeg(name)
        if jpeg is None:
            return text_response(HTTPStatus.SERVICE_UNAVAILABLE, "no processed frame yet",
                                 headers=(("Retry-After", "1"),))
        return Response(HTTPStatus.OK, jpeg, "image/jpeg")

    def _api_events(self, request: Request) -> Response:
        """What `yoloedge-ctl events --json` prints (`events.recent.events_reply`): `?camera=NAME`
        (404 for one that is not configured), `?limit=N` (1..1000, default 50); any other
        parameter, or one given twice, is a 400 rather than ignored."""
        try:
            query = parse_qs(request.query, keep_blank_values=True, strict_parsing=bool(request.query),
                             errors="strict", max_num_fields=len(EVENTS_QUERY))
        except (ValueError, UnicodeDecodeError):
            return text_response(HTTPStatus.BAD_REQUEST, "a query string of camera=NAME and limit=N, URL-encoded")
        extra = sorted(set(query) - set(EVENTS_QUERY))
        if extra or any(len(values) > 1 for values in query.values()):
            return text_response(HTTPStatus.BAD_REQUEST, "takes camera=NAME and limit=N, each once")
        events, snapshots = self._events, self._snapshots
        if events is None or snapshots is None:
            return text_response(HTTPStatus.NOT_FOUND, "this endpoint keeps no events")
        camera, limit = query.get("camera", [None])[0], query.get("limit", [None])[0]
        reply = events_reply(events, camera, limit, snapshots.known)
        if not reply["ok"]:
            missing = reply.get("reason") == "unknown_camera"
            return text_response(HTTPStatus.NOT_FOUND if missing else HTTPStatus.BAD_REQUEST, reply["error"])
        return Response(HTTPStatus.OK, encode(reply), "application/json")

    def _event_snapshot(self, request: Request) -> Response:
        """An event's best shot, its box drawn: 400 for a malformed id, 404 for an event without
        a shot (unknown, forgotten, or its shot dropped for the camera's budget)."""
        rest = request.path[len(EVENTS) + 1:]
        if not rest.endswith(SNAPSHOT_JPEG):
            return text_response(HTTPStatus.NOT_FOUND)
        try:
            event_id = unquote(rest[:-len(SNAPSHOT_JPEG)], errors="strict")
        except UnicodeDecodeError:
            event_id = ""
        if not valid_event_id(event_id):
            return text_response(HTTPStatus.BAD_REQUEST, "not an event id")
        jpeg = self._events.snapshot(event_id) if self._events is not None else None
        if jpeg is None:
            return text_response(HTTPStatus.NOT_FOUND, "no snapshot of that event")
        return Response(HTTPStatus.OK, jpeg, "image/jpeg")

    def stats(self) -> dict:
        """For the daemon's status: where it listens (null: off, or not bound) and how its
        accept() fares (`accept.Acceptor.stats`)."""
        server = self.server
        config = self.config
        acceptor = server.acceptor if server is not None else None
        if acceptor is None or config is None:
            return {"listen": None}
        return {"listen": listen_text(config), **acceptor.stats()}

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.stop()

    # -- routes ------------------------------------------------------------------------------
    def _metrics(self, request: Request) -> Response:
        return Response(HTTPStatus.OK, generate_latest(self.registry), CONTENT_TYPE_LATEST)

    def _api_status(self, request: Request) -> Response:
        """What `yoloedge-ctl status --json` prints: the same dict, from the same method."""
        body = json.dumps(self._status(), indent=2).encode()
        return Response(HTTPStatus.OK, body, "application/json")


def _auth(config: HttpConfig) -> BasicAuth | None:
    if config.username is None or config.password is None:
        return None
    return BasicAuth(config.username, config.password)


def _hosts(config: HttpConfig) -> HostPolicy:
    """Loopback names, the listen address and `allowed_hosts`; any name under `allow_remote`
    without `allowed_hosts` (see `web.access`)."""
    listen_host = config.listen[0] if config.listen is not None else None
    return HostPolicy(listen_host, config.allowed_hosts, any_host=config.allow_remote and not config.allowed_hosts)


def listen_text(config: HttpConfig) -> str:
    if config.listen is None:
        return "nothing (off)"
    host, port = config.listen
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

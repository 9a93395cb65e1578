"""Keep secrets out of every string that leaves the process.

Camera URLs carry credentials in shapes that no single pattern recognises: `rtsp://me@mail.com:p w/d@cam/s`
(an e-mail login, a space and a '/' in the password), `http://cam/video.cgi?user=admin&pwd=secret`,
`rtsp://cam/user=admin_password=secret_channel=1.sdp`. So a URL is not matched, it is taken apart:

- the userinfo ends at the LAST '@' of the URL (FFmpeg's leniency, pushed further: a password may hold
  '@', '/', '?', '#', ':' or spaces unencoded) and the whole of it is shown as `***`: a user name can
  be an e-mail address or a token, and which account a camera uses is in the config file;
- a port that is not a number (`rtsp://admin:secret` with the host forgotten) is shown as `***`;
- in the path, query and fragment, a parameter's value is shown only when its name is on the
  allowlist of harmless stream parameters (`channel=1`, `subtype=0`, `rtsp_transport=tcp`... see
  `SHOWN_KEYS`); every other value is `***`, and so are the pieces without '=' that follow it (a
  password holding '&' or '#'). A list of credential names can never be complete (`psw=`,
  `Kennwort=`, `ak=`, `x9=`): a list of what is harmless can. Names stay visible: they tell the
  operator which parameter to look at. In the query and fragment a piece without '=' (`?tcp`) is
  shown only when it is itself on the allowlist (`?AbC123` may be a token).

The price: an '@' in a path or query (`?mail=a@b`) hides everything before it; write it `%40`.

A string without `scheme://` may still be an address whose scheme was forgotten or mistyped
(`admin:pw@cam/s`, `rtsp//admin:pw@cam/s`, `rtsp;//...`): when a ':' comes before an '@', anywhere,
everything up to the last '@' is shown as `***` (see `schemeless_userinfo`). An ordinary path
(`/data/cam@2/v.mp4`) has no ':' before its '@' and stays readable.

`redact_url` gives the one display form of a URL; everything that shows a URL uses it. Text that
may quote a raw URL (an FFmpeg message, a traceback) goes through `redact_text`, which also replaces
every secret registered in `SECRETS` literally, in the forms it may take (percent-decoded too).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import unquote, unquote_plus

#: what a secret, or the credential part of a URL, is shown as: not even its length leaks.
MASK = "***"

#: secrets shorter than this are not replaced literally in free text: "12" or "ab" would also be
#: replaced inside counters and words, which garbles logs and shows where the secret occurs.
#: Structural redaction (`redact_url`) hides them whatever their length.
MIN_LITERAL_LENGTH = 4

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
#: a URL inside prose: from its scheme to the next white space...
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
#: ...less the punctuation of the prose around it (`'rtsp://...': cannot open`).
_TRAILING_PUNCTUATION = "'\"()<>[]{},.:;"
#: where parameters split in a path: '/', '&', ';', and '_' before `name=` (`user=a_password=b`).
_PATH_SEPARATORS = re.compile(r"([/&;]|_(?=[A-Za-z][A-Za-z0-9]*=))")
#: where parameters split in a query or fragment; '/' is not one (`?pwd=a/b` is one value).
_QUERY_SEPARATORS = re.compile(r"([&;?#])")

#: the parameters whose values are shown, normalised (see `_normalise`): stream selection, codec,
#: picture and transport options of Hikvision, Dahua/Amcrest, Axis (VAPIX), Reolink, Foscam,
#: Vivotek, ONVIF and FFmpeg URLs, and the synthetic source. A value of any other parameter is `***`.
SHOWN_KEYS = frozenset(_key.replace("_", "") for _key in (
    # which camera, channel and stream
    "channel", "channels", "ch", "chn", "channelid", "camera", "cam", "stream", "streamtype", "streamprofile",
    "subtype", "profile", "media", "track", "trackid", "video", "audio",
    # picture and codec
    "resolution", "res", "width", "height", "fps", "framerate", "bitrate", "quality", "compression",
    "codec", "videocodec", "audiocodec", "videoencoder", "format", "type", "mode", "rotation", "rotate",
    "mirror", "flip", "gop", "keyframe", "squarepixel",
    # transport
    "transport", "transportmode", "rtsp_transport", "proto", "protocol", "unicast", "multicast", "tcp",
    "udp", "http", "rtp", "timeout", "buffer_size", "pkt_size", "fifo_size", "overrun_nonfatal",
    # what a CGI is asked for (Foscam `cmd=GetMJStream`, mjpg-streamer `action=stream`)
    "cmd", "action",
    # the synthetic test source
    "image",
))


def _normalise(key: str) -> str:
    """`X-Api-Key`, `x_api_key` and `p%61ss` compare as `xapikey` and `pass`."""
    return "".join(c for c in unquote_plus(key).lower() if c.isalnum())


def is_shown_key(key: str) -> bool:
    """Whether the value of a URL parameter named `key` may be shown; any spelling (`RTSP_Transport`).

    Narrow on purpose: hiding a harmless value costs an operator a look at the config file, showing
    a secret cannot be undone.
    """
    return _normalise(key) in SHOWN_KEYS


@dataclass(frozen=True)
class UrlParts:
    """`scheme://[userinfo@]host[:port]rest`, split the lenient way described in the module docstring.

    `userinfo` is None when the URL has no '@'; `rest` is the path, query and fragment as written.
    """

    scheme: str
    userinfo: str | None
    host: str
    port: str | None
    rest: str


def split_url(url: str) -> UrlParts | None:
    """The parts of `url`, or None when it does not start with `scheme://` (a path, /dev/video0)."""
    match = _SCHEME.match(url)
    if match is None:
        return None
    scheme = url[:match.end() - 3]
    after = url[match.end():]
    before, at, hostpart = after.rpartition("@")
    userinfo = before if at else None
    end = len(hostpart)
    for stop in "/?#":
        found = hostpart.find(stop)
        if found != -1:
            end = min(end, found)
    authority, rest = hostpart[:end], hostpart[end:]
    host, port = _host_and_port(authority)
    return UrlParts(scheme, userinfo, host, port, rest)


def _host_and_port(authority: str) -> tuple[str, str | None]:
    """`[::1]:554` -> ('[::1]', '554'); `cam` -> ('cam', None); the port as written, maybe not a number."""
    if authority.startswith("["):
        close = authority.find("]")
        if close != -1:
            tail = authority[close + 1:]
            return authority[:close + 1], tail[1:] if tail.startswith(":") else None
    host, colon, port = authority.partition(":")
    return host, port if colon else None


def _port_is_secret(port: str | None) -> bool:
    return bool(port) and not (port or "").isdigit()


def redact_url(url: str) -> str:
    """The display form of `url`: userinfo, a non-numeric port and parameter values not on the
    allowlist (`is_shown_key`) as `***`.

    A string that is not `scheme://...` (a file path, /dev/video0) is returned as it is, unless it
    looks like an address with a forgotten or mistyped scheme (`schemeless_userinfo`): then its
    user-info is `***`. Applying it twice gives the same result, so a display form can safely be
    redacted again.
    """
    parts = split_url(url)
    if parts is None:
        userinfo = schemeless_userinfo(url)
        return url if userinfo is None else MASK + url[len(userinfo):]
    userinfo = "" if parts.userinfo is None else MASK + "@"
    port = "" if parts.port is None else ":" + (MASK if _port_is_secret(parts.port) else parts.port)
    return f"{parts.scheme}://{userinfo}{parts.host}{port}{_redact_rest(parts.rest)}"


def schemeless_userinfo(text: str) -> str | None:
    """The user-info of an address whose scheme was forgotten or mistyped (`admin:pw@cam/s`,
    `//me:p/w@cam`, `rtsp//admin:pw@cam`, `/etc/yoloedge/rtsp/admin:pw@cam` once resolved), up to
    its last '@', everything before it included; None for anything else.

    It looks like one when a ':' comes anywhere before its last '@' (`user:password@`; any path
    segment, because a mistyped scheme puts segments in front), or when its first path segment holds
    an '@' (`token@cam/s`). A file path seldom does: `/srv/cam@2x.mp4` is not one. Wrongly hiding a
    path's head costs a look at the config file; showing a password cannot be undone.
    """
    at = text.rfind("@")
    if at == -1:
        return None
    first = text.lstrip("/").split("/", 1)[0]
    if ":" not in text[:at] and "@" not in first:
        return None
    return text[:at]


def redact_value(text: str) -> str:
    """How a configuration string is shown in a message. From `scheme://` to the end of the value
    is one URL (spaces and all: a password may have them), shown in its display form, with whatever
    precedes it; an address without its scheme, or with a mistyped one, has its user-info hidden."""
    start = text.find("://")
    if start == -1:
        return redact_url(text)  # a path, or an address with a forgotten or mistyped scheme
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "+.-"):
        start -= 1
    if split_url(text[start:]) is None:  # no scheme before '://': hide all of it
        return text[:start] + MASK
    return text[:start] + redact_url(text[start:])


def _split_rest(rest: str) -> tuple[str, str]:
    """(path, query and fragment): the path ends at the first '?' or '#'."""
    ends = [i for i in (rest.find("?"), rest.find("#")) if i != -1]
    cut = min(ends) if ends else len(rest)
    return rest[:cut], rest[cut:]


def _redact_rest(rest: str) -> str:
    path, query = _split_rest(rest)
    return _redact_params(path, _PATH_SEPARATORS, False) + _redact_params(query, _QUERY_SEPARATORS, True)


def _secret_values(text: str, separators: re.Pattern, bare_is_value: bool) -> Iterable[tuple[int, str]]:
    """(index into the split pieces, hidden value) for each value in `text` not shown (`is_shown_key`).

    A piece without '=' right after a hidden value continues it (`pwd=a&b` for the password `a&b`).
    Elsewhere it is a path segment (shown), or with `bare_is_value` (a query or fragment) a value
    of its own, shown only when it is an allowlisted name (`?tcp`, not `?AbC123`).
    """
    pieces = separators.split(text)
    in_secret = False
    for index in range(0, len(pieces), 2):  # odd indexes are the separators themselves
        piece = pieces[index]
        key, eq, value = piece.partition("=")
        if eq:
            in_secret = not is_shown_key(key)
            if in_secret and value:
                yield index, value
        elif piece and (in_secret or (bare_is_value and not is_shown_key(piece))):
            yield index, piece


def _redact_params(text: str, separators: re.Pattern, bare_is_value: bool) -> str:
    pieces = separators.split(text)
    for index, value in _secret_values(text, separators, bare_is_value):
        piece = pieces[index]
        pieces[index] = piece[:len(piece) - len(value)] + MASK
    return "".join(pieces)


def url_secrets(url: str) -> list[tuple[str, str]]:
    """(text, replacement) pairs that hide the secrets of `url` wherever they appear verbatim.

    The raw URL becomes its display form (so a message that quotes it still names the host); its
    userinfo, password, a non-numeric port and every hidden parameter value become `***`, also in
    their percent-decoded forms (FFmpeg and OpenCV messages may show the decoded URL). Values of
    allowlisted parameters are never registered, so `main` or `tcp` is not scrubbed from every log
    line; a hidden value shorter than MIN_LITERAL_LENGTH is not either.
    """
    parts = split_url(url)
    if parts is None:
        userinfo = schemeless_userinfo(url)
        parts = None if userinfo is None else split_url("rtsp://" + url.lstrip("/"))
    if parts is None:
        return []
    secrets: list[str] = []
    if parts.userinfo is not None:
        secrets.append(parts.userinfo)
        _, colon, password = parts.userinfo.partition(":")
        if colon:
            secrets.append(password)
    if _port_is_secret(parts.port):
        secrets.append(parts.port or "")
    path, query = _split_rest(parts.rest)
    for text, separators, bare_is_value in ((path, _PATH_SEPARATORS, False), (query, _QUERY_SEPARATORS, True)):
        secrets.extend(value for _, value in _secret_values(text, separators, bare_is_value))
    safe = redact_value(url)
    pairs = [(form, safe) for form in _forms([url])] if safe != url else []
    pairs.extend((form, MASK) for form in _forms(secrets) if len(form) >= MIN_LITERAL_LENGTH)
    return pairs


def _forms(secrets: Iterable[str]) -> list[str]:
    """Each secret as written and percent-decoded (with and without '+' as a space)."""
    forms: list[str] = []
    for secret in secrets:
        for form in (secret, unquote(secret), unquote_plus(secret)):
            if form and form not in forms:
                forms.append(form)
    return forms


class SecretRegistry:
    """Every secret the configuration holds, for redacting free text that may quote one.

    Why process-wide: the logging filter sits on handlers set up before any camera starts, and an
    exception text from any thread (FFmpeg, OpenCV, paho) may quote a URL; neither can be handed
    the configuration. Secrets are added when the configuration is read (at start, on reload, by
    `check`) and never removed: a password from an earlier generation is still a password. Adding
    takes a lock; reading swaps in an immutable tuple, so the log filter never waits.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pairs: tuple[tuple[str, str], ...] = ()

    def add_url(self, url: str) -> None:
        """Register the secrets of a camera (or broker) URL; see `url_secrets`."""
        self._add(url_secrets(url))

    def add_secret(self, secret: str | None) -> None:
        """Register one secret value (a broker password), as written and percent-decoded."""
        if secret:
            self._add((form, MASK) for form in _forms([secret]) if len(form) >= MIN_LITERAL_LENGTH)

    def _add(self, pairs: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            known = dict(self._pairs)
            known.update(pairs)
            self._pairs = tuple(sorted(known.items(), key=lambda pair: len(pair[0]), reverse=True))

    def pairs(self) -> tuple[tuple[str, str], ...]:
        return self._pairs

    def scrub(self, text: str) -> str:
        """`text` with every registered secret replaced."""
        for secret, replacement in self._pairs:
            if secret in text:
                text = text.replace(secret, replacement)
        return text


#: the process's registry (see `SecretRegistry` for why there is one).
SECRETS = SecretRegistry()


def redact_text(text: str, registry: SecretRegistry = SECRETS) -> str:
    """`text` with every registered secret replaced, then every URL in it in its display form."""
    return _URL_IN_TEXT.sub(_redact_match, registry.scrub(text))


def _redact_match(match: re.Match) -> str:
    url = match.group(0).rstrip(_TRAILING_PUNCTUATION)
    return redact_url(url) + match.group(0)[len(url):]


def redact(value: object) -> str:
    """How a secret (a password, a token) is shown: `***`, so not even its length leaks.

    An empty or missing secret is shown as such, because "the password is empty" is often the very
    mistake an operator is looking for.
    """
    if value is None:
        return "null"
    if value == "":
        return "''"
    return MASK

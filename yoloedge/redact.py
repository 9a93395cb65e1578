"""Keep secrets out of logs and status output.

Camera and broker URLs carry credentials (`rtsp://admin:secret@10.0.0.5/stream`); anything that
prints or logs a URL passes it through `redact_url` first.
"""

from __future__ import annotations

import re

#: scheme://user:password@ -- the password runs to the last '@' before the path, so an
#: unencoded '@' inside the password does not leak its tail.
_USERINFO = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s?#]*):(?P<password>[^\s/?#]*)@")


def redact_url(url: str) -> str:
    """Return `url` with the password of every `scheme://user:pass@` replaced by `***`.

    The user name stays (it tells an operator which account is configured); a URL without a
    password is returned unchanged. Works on a bare URL and on text that contains URLs.
    """
    return _USERINFO.sub(r"\g<head>:***@", url)


def redact(value: object) -> str:
    """How a secret (a password, a token) is shown: `***`, so not even its length leaks.

    An empty or missing secret is shown as such, because "the password is empty" is often the very
    mistake an operator is looking for.
    """
    if value is None:
        return "null"
    if value == "":
        return "''"
    return "***"

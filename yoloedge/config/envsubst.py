"""`${VAR}` references in config strings, filled from an explicit environment mapping.

Secrets (broker passwords, camera credentials) belong in the service's environment (systemd
`EnvironmentFile=`), not in a world-readable YAML file. The mapping is passed in rather than read
from `os.environ`, so loading stays a pure function that tests can drive.

    ${NAME}            the variable; an error when it is not set
    ${NAME:-default}   `default` when NAME is unset or empty
    ${NAME-default}    `default` when NAME is unset
    $${                a literal `${`
"""

from __future__ import annotations

import re
from typing import Mapping

_TOKEN = re.compile(r"\$\$\{|\$\{(?P<body>[^}]*)\}|\$\{")
_BODY = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-)(?P<default>.*))?", re.S)


class SubstitutionError(ValueError):
    """A reference cannot be filled; the message names the variable or shows the bad reference."""


def has_references(text: str) -> bool:
    return "${" in text


def substitute(text: str, environ: Mapping[str, str]) -> str:
    """Replace every reference in `text`; raise SubstitutionError for the first one that fails."""
    return _TOKEN.sub(lambda match: _replacement(match, environ), text)


def _replacement(match: re.Match, environ: Mapping[str, str]) -> str:
    token = match.group(0)
    if token == "$${":
        return "${"
    body = match.group("body")
    if body is None:
        raise SubstitutionError("'${' is not closed by '}' (write $${ for a literal '${')")
    parsed = _BODY.fullmatch(body)
    if parsed is None:
        raise SubstitutionError(f"bad reference {token}: write ${{NAME}} or ${{NAME:-default}}")
    return _value(parsed.group("name"), parsed.group("op"), parsed.group("default"), environ)


def _value(name: str, op: str | None, default: str | None, environ: Mapping[str, str]) -> str:
    value = environ.get(name)
    if op == ":-" and not value:
        return default or ""
    if op == "-" and value is None:
        return default or ""
    if value is None:
        raise SubstitutionError(f"environment variable {name} is not set "
                                f"(set it in the service's environment, or give a default: ${{{name}:-...}})")
    return value

"""Configuration errors: every problem in a file, each with the place it was found.

An operator fixing a config file wants all mistakes at once, each pointing at a line, so the loader
collects `ConfigIssue`s and raises one `ConfigError` holding them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import YoloedgeError

#: sysexits.h EX_CONFIG: the exit code of every command that stops on a configuration error.
EX_CONFIG = 78


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: where it is, which key, how the bad value looks (already redacted) and why.

    `line` and `column` are 1-based; 0 or None when the problem has no place in the file (an
    unreadable file). `value` is the display form of the offending value, never the raw value, so a
    password cannot leak through a log of the exception; None when there is no single bad value
    (a missing key, an unknown key).
    """

    file: str
    line: int | None
    column: int | None
    key_path: str
    value: str | None
    message: str
    hint: str | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        what = f"{self.value} is not allowed: {self.message}" if self.value is not None else self.message
        text = f"{where}: {self.key_path}: {what}" if self.key_path else f"{where}: {what}"
        return f"{text} ({self.hint})" if self.hint else text


class ConfigError(YoloedgeError):
    """The configuration cannot be used; `issues` lists every problem found, in file order."""

    exit_code = EX_CONFIG

    def __init__(self, issues: Sequence[ConfigIssue]):
        self.issues = list(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))

    def __str__(self) -> str:
        return "\n".join(str(issue) for issue in self.issues)


class IssueLog:
    """Collects the issues found in one file while reading carries on, then raises them together."""

    def __init__(self, file: str):
        self.file = file
        self.issues: list[ConfigIssue] = []

    def add(self, line: int | None, column: int | None, key_path: str, message: str,
            value: str | None = None, hint: str | None = None) -> None:
        self.issues.append(ConfigIssue(self.file, line, column, key_path, value, message, hint))

    def raise_if_any(self) -> None:
        if self.issues:
            ordered = sorted(self.issues, key=lambda issue: (issue.line or 0, issue.column or 0))
            raise ConfigError(ordered)

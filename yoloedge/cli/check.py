"""`yoloedge check`: validate a config file without starting anything.

Prints "FILE: OK (N cameras, M accelerators)" and exits 0, or prints every problem on stderr, one
per line as FILE:LINE: KEY: MESSAGE, and exits 78 (EX_CONFIG), the code `yoloedge run` and systemd
see for the same mistakes. It never opens a camera, a device, the broker or the model: it is safe to
run next to the running daemon, e.g. before `systemctl reload yoloedge`.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, TextIO

from ..config.errors import EX_CONFIG, ConfigError, ConfigIssue
from ..config.loader import DEFAULT_PATH, load_config, read_text_file
from ..textsafe import printable

#: the largest environment file read (a few KEY=VALUE lines; a certificate in one stays far below).
MAX_ENV_FILE_BYTES = 1024 * 1024


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="validate a configuration file",
                       description="Validate a configuration file and list every problem with its line. "
                                   f"Exits 0 when it is usable, {EX_CONFIG} otherwise.")
    p.add_argument("-c", "--config", default=DEFAULT_PATH, help=f"configuration file (default {DEFAULT_PATH})")
    p.add_argument("--env-file", action="append", default=[], metavar="FILE",
                   help="read ${VAR} values from this KEY=VALUE file too (the service's EnvironmentFile=), "
                        "over the current environment; may be repeated")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        environ = environment(os.environ, args.env_file)
        config = load_config(args.config, environ)
    except ConfigError as exc:
        print(printable(str(exc), keep_newlines=True), file=err)  # messages quote the file's keys
        return EX_CONFIG
    print(printable(f"{args.config}: OK ({_count(len(config.cameras), 'camera')}, "
                    f"{_count(len(config.accelerators), 'accelerator')})"), file=out)
    return 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def environment(base: Mapping[str, str], env_files: list[str]) -> dict[str, str]:
    """`base` with the variables of each env file on top, as systemd would set them."""
    environ = dict(base)
    for path in env_files:
        environ.update(read_env_file(path))
    return environ


def read_env_file(path: str) -> dict[str, str]:
    """KEY=VALUE lines as in a systemd EnvironmentFile: '#' and ';' comments, optional quotes. Read
    as the config file is (a FIFO, a device, a binary file are ConfigErrors, not a hang or a traceback)."""
    lines = read_text_file(path, MAX_ENV_FILE_BYTES, "the environment file",
                           "an environment file holds a few KEY=VALUE lines").splitlines()
    values = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError([ConfigIssue(path, number, 1, "", None, "expected KEY=VALUE")])
        values[key.strip()] = _unquoted(value.strip())
    return values


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value

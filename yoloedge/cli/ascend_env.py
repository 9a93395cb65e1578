"""`yoloedge ascend-env`: CANN's set_env.sh as a systemd EnvironmentFile.

pyACL (`import acl`) and the libraries under it are found only through the variables CANN's
`set_env.sh` exports (PYTHONPATH, LD_LIBRARY_PATH, ASCEND_TOOLKIT_HOME, ASCEND_OPP_PATH, PATH, ...).
It is a bash script (`$(...)`, `${VAR}:...` appends, conditionals), and systemd's EnvironmentFile=
cannot run a script, so under the shipped unit `import acl` failed unless the operator translated
the variables by hand, again after every CANN upgrade.

This command runs the script the way a shell would, in bash with a clean environment (the PATH a
system service starts with, nothing else from the caller but HOME), and writes every variable the
script set or changed, in EnvironmentFile syntax, to the file the unit reads
(`EnvironmentFile=-/etc/yoloedge/ascend.env`; the `-` leaves hosts without it unaffected):

* values in double quotes, with `\\`, `"`, `` ` `` and `$` escaped (systemd expands nothing, but
  treats backslashes in double quotes as a POSIX shell does); a newline stays a newline;
* in PATH, LD_LIBRARY_PATH and PYTHONPATH, empty entries are dropped (the script's
  `...:$LD_LIBRARY_PATH` leaves one when the variable was unset, and an empty entry means the
  current directory) and so are repeated ones (the first one found wins anyway);
* what bash sets itself (PWD, SHLVL, _) and what systemd could not set (names that are not
  identifiers, such as bash's exported functions, values with control characters or not UTF-8)
  are left out and named on stderr; so are variables the script unset.

`yoloedge check --env-file` reads the result with a port of systemd's parser (`check.read_env_file`);
the tests hold the two to each other and run the service under a booted systemd with the file.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence, TextIO

from ..files import regular_file_problem, write_atomically
from ..textsafe import printable

#: where CANN's packages put set_env.sh when installed as root, most complete first: the
#: developer toolkit, the inference runtime (nnrt), the training engine (nnae).
DEFAULT_SET_ENV = ("/usr/local/Ascend/ascend-toolkit/set_env.sh", "/usr/local/Ascend/nnrt/set_env.sh",
                   "/usr/local/Ascend/nnae/set_env.sh")
DEFAULT_OUTPUT = "/etc/yoloedge/ascend.env"
#: the PATH systemd gives a system service (systemd.exec(5), "Environment variables in spawned
#: processes"), with /sbin and /bin for hosts whose /usr is not merged.
SERVICE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: colon-separated search paths in which an empty entry means the current directory.
SEARCH_PATHS = frozenset({"PATH", "LD_LIBRARY_PATH", "PYTHONPATH"})
#: set by bash itself, not by the script.
BASH_OWN = frozenset({"_", "PWD", "OLDPWD", "SHLVL"})
SOURCE_TIMEOUT_S = 60.0
MAX_SET_ENV_BYTES = 1024 * 1024
EXIT_OK = 0
EXIT_FAILED = 1

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ESCAPE_IN_DOUBLE_QUOTES = re.compile(r'([\\"`$])')
#: sources every file named after the script name, with no positional parameters (a set_env.sh
#: that looks at "$1" must not see the next file), its output on stderr, then prints the
#: environment NUL-separated on stdout; exit status: the first failing file's.
_SCRIPT = """\
__yoloedge_files=("$@"); __yoloedge_status=0; set --
for __yoloedge_file in "${__yoloedge_files[@]}"; do
    source "$__yoloedge_file" >&2
    __yoloedge_rc=$?
    if [ "$__yoloedge_rc" -ne 0 ] && [ "$__yoloedge_status" -eq 0 ]; then __yoloedge_status=$__yoloedge_rc; fi
done
env -0
exit "$__yoloedge_status"
"""


class AscendEnvError(Exception):
    """The environment could not be worked out; the message says why and what to do."""


@dataclass
class EnvFile:
    """What set_env.sh changed: the variables to write, and what had to be left out (and why)."""

    values: dict[str, str] = field(default_factory=dict)
    left_out: list[str] = field(default_factory=list)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "ascend-env", help="write CANN's set_env.sh variables as a systemd EnvironmentFile",
        description="Source CANN's set_env.sh in bash with a clean environment and write the variables it "
                    "sets, in systemd EnvironmentFile syntax, for the service to read "
                    f"(EnvironmentFile=-{DEFAULT_OUTPUT} in the shipped unit). Run it again after installing "
                    "or upgrading CANN, then restart the service.")
    p.add_argument("--set-env", action="append", default=[], metavar="PATH",
                   help="CANN's set_env.sh; may be repeated, sourced in order (default: the first of "
                        f"{', '.join(DEFAULT_SET_ENV)} that exists)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help=f"write the file here (e.g. {DEFAULT_OUTPUT}; replaced in one step, mode 0644) "
                        "instead of printing it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        scripts = args.set_env or [default_set_env()]
        env = environment_of(scripts, os.environ, err)
        text = render(env.values, scripts)
    except AscendEnvError as exc:
        print(printable(f"yoloedge ascend-env: {exc}"), file=err)
        return EXIT_FAILED
    for note in env.left_out:
        print(printable(f"yoloedge ascend-env: left out {note}"), file=err)
    if not args.output:
        out.write(text)
        return EXIT_OK
    try:
        write_atomically(args.output, text.encode("utf-8"), mode=0o644)
    except OSError as exc:
        print(printable(f"yoloedge ascend-env: cannot write {args.output}: {exc.strerror or exc}"), file=err)
        return EXIT_FAILED
    print(printable(f"{args.output}: {len(env.values)} variable(s) from {', '.join(scripts)}; "
                    "restart the service to use them"), file=err)
    return EXIT_OK


def default_set_env(candidates: Sequence[str] = DEFAULT_SET_ENV) -> str:
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise AscendEnvError(f"no CANN set_env.sh at {', '.join(candidates)}; name yours with --set-env PATH "
                         "(a non-root install has it under ~/Ascend/)")


def environment_of(scripts: Sequence[str], caller: Mapping[str, str], err: TextIO | None = None) -> EnvFile:
    """The variables `scripts`, sourced in order, set or change (see the module docstring)."""
    for path in scripts:
        problem = regular_file_problem(path, MAX_SET_ENV_BYTES)
        if problem is not None:  # a FIFO would hang bash; a directory would only confuse it
            raise AscendEnvError(f"set_env.sh {problem}")
    clean = {"PATH": SERVICE_PATH}
    if "HOME" in caller:
        clean["HOME"] = caller["HOME"]
    before, _ = _sourced([], clean)
    after, status = _sourced([os.path.abspath(p) for p in scripts], clean)
    if status != 0 and err is not None:
        print(printable(f"yoloedge ascend-env: warning: sourcing {', '.join(scripts)} returned {status}; "
                        "writing the variables it had set by then (its messages are above)"), file=err)
    return changes(before, after)


def _sourced(scripts: Sequence[str], clean: Mapping[str, str]) -> tuple[dict[bytes, bytes], int]:
    try:
        result = subprocess.run(["bash", "--noprofile", "--norc", "-c", _SCRIPT, "yoloedge-ascend-env", *scripts],
                                env=dict(clean), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                timeout=SOURCE_TIMEOUT_S, cwd="/")
    except FileNotFoundError as exc:
        raise AscendEnvError("bash is needed to source set_env.sh and was not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise AscendEnvError(f"sourcing {', '.join(scripts)} did not finish within {SOURCE_TIMEOUT_S:g} s") from exc
    env = {}
    for entry in result.stdout.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            env[name] = value
    if not env:
        raise AscendEnvError(f"{', '.join(scripts)} ended the shell (exit {result.returncode}) before its "
                             "variables could be read; does it call `exit`?")
    return env, result.returncode


def changes(before: Mapping[bytes, bytes], after: Mapping[bytes, bytes]) -> EnvFile:
    """What differs from `before` in `after` (raw `env -0` entries), as systemd can set it."""
    found = EnvFile()
    for raw_name in sorted(after):
        raw_value = after[raw_name]
        if before.get(raw_name) == raw_value:
            continue
        try:
            name, value = raw_name.decode("utf-8"), raw_value.decode("utf-8")
        except UnicodeDecodeError:
            found.left_out.append(f"{raw_name!r}: not UTF-8, which systemd requires")
            continue
        if name in BASH_OWN:
            continue
        problem = unwritable(name, value)
        if problem is not None:
            found.left_out.append(f"{name}: {problem}")
            continue
        found.values[name] = search_path(value) if name in SEARCH_PATHS else value
    for raw_name in sorted(set(before) - set(after)):
        found.left_out.append(f"{raw_name.decode('utf-8', 'replace')}: the script unsets it, which an "
                              "EnvironmentFile cannot express (UnsetEnvironment= in a drop-in can)")
    return found


def unwritable(name: str, value: str) -> str | None:
    """Why systemd would not set `name`=`value` from an env file, or None."""
    if not _NAME.fullmatch(name):
        return "not a variable name systemd accepts (letters, digits and '_', not starting with a digit)"
    if any((char < " " or char == "\x7f") and char not in "\t\n" for char in value):
        return "its value holds a control character"
    return None


def search_path(value: str) -> str:
    """A colon-separated search path without empty entries (the current directory) or repeats."""
    kept: list[str] = []
    for entry in value.split(":"):
        if entry and entry not in kept:
            kept.append(entry)
    return ":".join(kept)


def quote(value: str) -> str:
    """`value` as a double-quoted EnvironmentFile value that systemd reads back unchanged."""
    return '"' + _ESCAPE_IN_DOUBLE_QUOTES.sub(r"\\\1", value) + '"'


def render(values: Mapping[str, str], scripts: Iterable[str]) -> str:
    lines = [f"# Written by `yoloedge ascend-env` from {printable(', '.join(scripts))}: what it sets, for the",
             "# service's EnvironmentFile=. Do not edit: run the command again after installing or",
             "# upgrading CANN (put your own variables in yoloedge.env, which is read after this file)."]
    lines += [f"{name}={quote(value)}" for name, value in values.items()]
    return "\n".join(lines) + "\n"

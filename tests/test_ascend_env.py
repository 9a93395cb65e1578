"""`yoloedge ascend-env`: CANN's set_env.sh (a bash script) turned into a systemd EnvironmentFile.

The stand-in set_env.sh scripts here are written in the style of CANN's own (exports built from
`$(cd $(dirname ${BASH_SOURCE[0]}); pwd)`, `...:$LD_LIBRARY_PATH` appends, conditionals) and sourced
by real bash. What the written file means is read back by `check.read_env_file`, the port of
systemd's env-file parser that `yoloedge check --env-file` uses; test_systemd.py runs the service
under a booted systemd with such a file.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from yoloedge.cli import ascend_env
from yoloedge.cli.ascend_env import AscendEnvError, environment_of, quote, render, search_path
from yoloedge.cli.check import read_env_file

TOOLKIT_STYLE = r"""#!/bin/bash
# a stand-in for CANN's ascend-toolkit/set_env.sh, in its style
path="${BASH_SOURCE[0]}"
if [[ -f "$path" ]] && [[ "$path" =~ set_env.sh ]]; then
    toolkit_path=$(cd "$(dirname "$path")"; pwd)
    export ASCEND_TOOLKIT_HOME=${toolkit_path}/latest
    export LD_LIBRARY_PATH=${ASCEND_TOOLKIT_HOME}/lib64:${ASCEND_TOOLKIT_HOME}/lib64/plugin/opskernel:$LD_LIBRARY_PATH
    export PYTHONPATH=${ASCEND_TOOLKIT_HOME}/opp/built-in/op_impl/ai_core/tbe:$PYTHONPATH
    export PYTHONPATH=${ASCEND_TOOLKIT_HOME}/python/site-packages:${PYTHONPATH}
    export PATH=${ASCEND_TOOLKIT_HOME}/bin:${ASCEND_TOOLKIT_HOME}/compiler/ccec_compiler/bin:$PATH
    export ASCEND_AICPU_PATH=${ASCEND_TOOLKIT_HOME}
    export ASCEND_OPP_PATH=${ASCEND_TOOLKIT_HOME}/opp
    export TOOLCHAIN_HOME=${ASCEND_TOOLKIT_HOME}/toolkit
    export ASCEND_HOME_PATH=${ASCEND_TOOLKIT_HOME}
fi
if [ -d "${toolkit_path}/no-such-package" ]; then
    export NEVER_SET=1
fi
"""

#: values that need quoting, each with what makes it hard
HARD_VALUES = {
    "SPACES": "  two  leading and trailing  ",
    "DOLLAR": "$HOME ${PATH} $(id) `id` $",
    "QUOTES": "it's \"quoted\" 'twice'",
    "BACKSLASHES": "a\\b \\\\ \\n \\$ \\\" end\\",
    "NEWLINES": "first\nsecond\n\nfourth\n",
    "BACKSLASH_NEWLINE": "line\\\nnext",
    "TAB": "a\tb",
    "COMMENT_LIKE": "# not a comment ; nor this",
    "EMPTY": "",
    "EQUALS": "a=b==c",
    "UNICODE": "Zürich \u4e2d\u6587 \u00e9",
}


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def toolkit(tmp_path: Path) -> Path:
    return write(tmp_path / "Ascend" / "ascend-toolkit" / "set_env.sh", TOOLKIT_STYLE)


def read_back(tmp_path: Path, values: dict[str, str]) -> dict[str, str]:
    """`values` written as an env file, then read as systemd would (check's port of its parser)."""
    env = write(tmp_path / "written.env", render(values, ["/x/set_env.sh"]))
    return read_env_file(str(env))


# -- quoting -------------------------------------------------------------------------------------

def test_every_hard_value_reads_back_unchanged(tmp_path):
    assert read_back(tmp_path, HARD_VALUES) == HARD_VALUES


def test_quoting_escapes_what_double_quotes_treat_specially_and_nothing_else():
    assert quote('say "hi"') == r'"say \"hi\""'
    assert quote("$HOME") == r'"\$HOME"'
    assert quote("a\\b") == r'"a\\b"'
    assert quote("`id`") == r'"\`id\`"'
    assert quote("it's") == '"it\'s"'
    assert quote("one\ntwo") == '"one\ntwo"'


def test_a_value_from_bash_survives_the_round_trip(tmp_path):
    """Through real bash (set by the script's own quoting), then the file, then systemd's rules."""
    lines = [f"export {name}={shell_quote(value)}" for name, value in HARD_VALUES.items()]
    script = write(tmp_path / "set_env.sh", "\n".join(lines) + "\n")
    found = environment_of([str(script)], {})
    assert found.values == HARD_VALUES
    assert read_back(tmp_path, found.values) == HARD_VALUES


def shell_quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


# -- what is written -----------------------------------------------------------------------------

def test_a_toolkit_style_script_gives_its_variables_and_no_empty_search_path_entries(tmp_path):
    script = toolkit(tmp_path)
    home = f"{tmp_path}/Ascend/ascend-toolkit/latest"
    found = environment_of([str(script)], {"HOME": "/home/op", "LD_LIBRARY_PATH": "/caller/lib",
                                           "PYTHONPATH": "/caller/py", "SECRET": "the caller's"})
    assert found.values == {
        "ASCEND_TOOLKIT_HOME": home,
        "ASCEND_AICPU_PATH": home,
        "ASCEND_HOME_PATH": home,
        "ASCEND_OPP_PATH": f"{home}/opp",
        "TOOLCHAIN_HOME": f"{home}/toolkit",
        # the service has no LD_LIBRARY_PATH or PYTHONPATH of its own: no trailing ':' (the current
        # directory), and nothing of the caller's
        "LD_LIBRARY_PATH": f"{home}/lib64:{home}/lib64/plugin/opskernel",
        "PYTHONPATH": f"{home}/python/site-packages:{home}/opp/built-in/op_impl/ai_core/tbe",
        # the PATH a system service starts with, behind the script's entries
        "PATH": f"{home}/bin:{home}/compiler/ccec_compiler/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                "/usr/bin:/sbin:/bin",
    }
    assert found.left_out == []


def test_unchanged_and_bash_own_variables_are_not_written(tmp_path):
    script = write(tmp_path / "set_env.sh", 'export HOME="$HOME"\nexport PATH=$PATH\ncd /tmp\n'
                                            "export ASCEND_X=1\nunset_me=1\n")
    found = environment_of([str(script)], {"HOME": "/home/op"})
    assert found.values == {"ASCEND_X": "1"}  # not HOME, PATH, PWD, OLDPWD, SHLVL, _, nor unexported


def test_search_paths_lose_empty_and_repeated_entries_other_values_are_kept_as_they_are():
    assert search_path("/a::/b:/a:") == "/a:/b"
    assert search_path(":/only") == "/only"
    assert search_path("") == ""


def test_search_paths_only_the_three_others_verbatim(tmp_path):
    script = write(tmp_path / "set_env.sh", "export LD_LIBRARY_PATH=/x/lib:/x/lib::$LD_LIBRARY_PATH\n"
                                            "export ASCEND_CUSTOM_OPP_PATH=/a::/b:\n"
                                            "export PYTHONPATH=/p:$PYTHONPATH\n")
    found = environment_of([str(script)], {})
    assert found.values == {"LD_LIBRARY_PATH": "/x/lib", "ASCEND_CUSTOM_OPP_PATH": "/a::/b:", "PYTHONPATH": "/p"}


def test_several_scripts_are_sourced_in_order_without_arguments(tmp_path):
    first = write(tmp_path / "toolkit" / "set_env.sh",
                  'export SEEN_ARGS="$#:$*"\nexport LD_LIBRARY_PATH=/toolkit/lib64:$LD_LIBRARY_PATH\n')
    second = write(tmp_path / "driver" / "set_env.sh",
                   'export SECOND_SEES="$#"\nexport LD_LIBRARY_PATH=/driver/lib64:${LD_LIBRARY_PATH}\n'
                   'echo "set_env: done"\n')  # chatter on stdout must not end up in the file
    found = environment_of([str(first), str(second)], {})
    assert found.values == {"SEEN_ARGS": "0:", "SECOND_SEES": "0", "LD_LIBRARY_PATH": "/driver/lib64:/toolkit/lib64"}


def test_what_systemd_cannot_set_is_left_out_and_named(tmp_path):
    script = write(tmp_path / "set_env.sh", "helper() { echo hi; }\nexport -f helper\n"
                                            "export CONTROL=$'bell\\a'\nexport GOOD=1\n"
                                            "unset HOME\n")
    found = environment_of([str(script)], {"HOME": "/home/op"})
    assert found.values == {"GOOD": "1"}
    notes = "\n".join(found.left_out)
    assert "BASH_FUNC_helper%%: not a variable name" in notes
    assert "CONTROL: its value holds a control character" in notes
    assert "HOME: the script unsets it" in notes


def test_a_failing_script_is_a_warning_one_that_exits_the_shell_an_error(tmp_path, capsys):
    failing = write(tmp_path / "a" / "set_env.sh", "export DONE=1\n[ -d /no/such/dir ]\n")
    found = environment_of([str(failing)], {}, sys.stderr)
    assert found.values == {"DONE": "1"}
    assert "returned 1; writing the variables it had set by then" in capsys.readouterr().err
    exiting = write(tmp_path / "b" / "set_env.sh", "export DONE=1\nexit 3\n")
    with pytest.raises(AscendEnvError, match="ended the shell .exit 3.*does it call `exit`"):
        environment_of([str(exiting)], {})


def test_a_fifo_or_a_missing_file_is_refused_without_running_bash(tmp_path):
    fifo = tmp_path / "set_env.sh"
    os.mkfifo(fifo)
    with pytest.raises(AscendEnvError, match="not a regular file .a FIFO."):
        environment_of([str(fifo)], {})
    with pytest.raises(AscendEnvError, match="not found"):
        environment_of([str(tmp_path / "missing.sh")], {})


def test_the_default_is_the_first_set_env_sh_that_exists(tmp_path):
    candidates = [str(tmp_path / name / "set_env.sh") for name in ("ascend-toolkit", "nnrt", "nnae")]
    with pytest.raises(AscendEnvError, match="no CANN set_env.sh at .*--set-env PATH"):
        ascend_env.default_set_env(candidates)
    write(Path(candidates[2]), "")
    write(Path(candidates[1]), "")
    assert ascend_env.default_set_env(candidates) == candidates[1]
    assert ascend_env.DEFAULT_SET_ENV[0] == "/usr/local/Ascend/ascend-toolkit/set_env.sh"


# -- the command, and `yoloedge check` with its file ---------------------------------------------

def yoloedge(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "yoloedge", *args], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=60)


def test_the_command_writes_a_file_check_accepts(tmp_path):
    script = toolkit(tmp_path)
    out = tmp_path / "etc" / "ascend.env"
    out.parent.mkdir()
    result = yoloedge("ascend-env", "--set-env", str(script), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert f"{out}: 8 variable(s) from {script}; restart the service" in result.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    written = read_env_file(str(out))
    assert written["ASCEND_OPP_PATH"] == f"{tmp_path}/Ascend/ascend-toolkit/latest/opp"
    assert out.read_text().startswith(f"# Written by `yoloedge ascend-env` from {script}")
    printed = yoloedge("ascend-env", "--set-env", str(script))
    assert printed.returncode == 0 and printed.stdout == out.read_text()


def test_the_command_says_what_is_wrong_and_exits_1(tmp_path):
    result = yoloedge("ascend-env", "--set-env", str(tmp_path / "nothing.sh"))
    assert result.returncode == 1
    assert result.stderr.startswith("yoloedge ascend-env: set_env.sh ") and "not found" in result.stderr
    unwritable = yoloedge("ascend-env", "--set-env", str(toolkit(tmp_path)), "-o", str(tmp_path / "no" / "x.env"))
    assert unwritable.returncode == 1 and "cannot write" in unwritable.stderr


def ascend_config(tmp_path: Path) -> Path:
    om = write(tmp_path / "model.om", "fake om")
    config = {"device_id": "npu-box", "model": {"path": str(om)},
              "accelerators": [{"name": "npu", "backend": "ascend", "devices": [0]}]}
    return write(tmp_path / "yoloedge.yaml", yaml.safe_dump(config))


def test_check_points_to_ascend_env_when_acl_is_missing_and_not_where_the_env_file_finds_it(tmp_path):
    config = ascend_config(tmp_path)
    bare = yoloedge("check", "-c", str(config))
    assert bare.returncode == 0, bare.stderr
    assert "accelerator npu (backend ascend): the module 'acl' is not installed here" in bare.stderr
    assert "yoloedge ascend-env -o /etc/yoloedge/ascend.env" in bare.stderr

    site = tmp_path / "Ascend" / "ascend-toolkit" / "latest" / "python" / "site-packages"
    write(site / "acl" / "__init__.py", "")  # where the toolkit keeps pyACL
    env_file = tmp_path / "ascend.env"
    assert yoloedge("ascend-env", "--set-env", str(toolkit(tmp_path)), "-o", str(env_file)).returncode == 0
    served = yoloedge("check", "-c", str(config), "--env-file", str(env_file))
    assert served.returncode == 0 and "note:" not in served.stderr, served.stderr
    assert str(site) in read_env_file(str(env_file))["PYTHONPATH"].split(":")

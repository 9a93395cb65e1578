"""Out of file descriptors: the HTTP endpoint and the control socket refuse new clients cleanly,
log a bounded number of lines, and serve again once descriptors are free.

Each case runs in a subprocess (RLIMIT_NOFILE is the whole process's), on a clock the script
moves: the servers' pauses and the log's report interval are counted on it, not on the wall."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from daemon_harness import REPO
from yoloedge.accept import PAUSE_MAX_S, REPORT_EVERY_S

ATTEMPTS = 40
#: clock time between two attempts: longer than any pause, so each attempt finds the listener watched
STEP_S = PAUSE_MAX_S + 0.5

SCRIPT = r"""
import json, logging, os, resource, socket, sys, threading, time

kind, folder, attempts, step = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s %(message)s")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


clock = Clock()
if kind == "http":
    from http import HTTPStatus
    from yoloedge.web.server import HttpServer, Router, text_response
    router = Router(clock)
    router.add("/x", lambda request: text_response(HTTPStatus.OK, "fine"))
    server = HttpServer("127.0.0.1", 0, router, clock=clock)
    server.start()
    address, family = ("127.0.0.1", server.address[1]), socket.AF_INET
    wake = server._mux.poke
    request = b"GET /x HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
else:
    from yoloedge.control.server import ControlServer
    server = ControlServer(os.path.join(folder, "c.sock"), 0o600, lambda r: {"ok": True, "fine": 1},
                           clock=clock)
    server.start()
    address, family = server.path, socket.AF_UNIX
    wake = server._mux.poke
    request = b'{"cmd": "status"}\n'


# The client runs in a process of its own, as a real one does: started now, it has descriptors
# whatever this process is short of, and the server's own use of a freed slot cannot take its.
CLIENT = r'''
import json, socket, sys
family, address = int(sys.argv[1]), json.loads(sys.argv[2])
address = tuple(address) if isinstance(address, list) else address
for line in sys.stdin:
    data = json.loads(line).encode("latin-1")
    # "hung" when the server neither answers nor closes within 10 s
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.settimeout(10)
    try:
        sock.connect(address)
        if data:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)  # that was all: the control socket closes after its answer
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                reply = b"".join(chunks).decode("utf-8", "replace")
                break
            chunks.append(chunk)
    except socket.timeout:
        reply = "hung"
    except ConnectionResetError:
        reply = "reset"
    finally:
        sock.close()
    print(json.dumps(reply), flush=True)
'''
import subprocess
client = subprocess.Popen([sys.executable, "-c", CLIENT, str(int(family)), json.dumps(address)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def exchange(data):
    client.stdin.write(json.dumps(data.decode("latin-1")) + "\n")
    client.stdin.flush()
    return json.loads(client.stdout.readline())


before = exchange(request)  # served while there are descriptors
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16, hard))
fillers = []
while True:
    try:
        fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break

replies = []
for _ in range(attempts):
    replies.append(exchange(b""))
    if replies[-1] == "hung":
        break
    clock.now += step  # the server's pause is over...
    wake()  # ...and its I/O thread looks at the clock again
stats_short = server.acceptor.stats()

for fd in fillers:
    os.close(fd)
resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
clock.now += step
wake()
after = exchange(request)
client.stdin.close()
client.wait()
print(json.dumps({"before": before, "replies": replies, "after": after, "stats_short": stats_short,
                  "stats_after": server.acceptor.stats(), "span_s": attempts * step}))
sys.stdout.flush()
server.stop()
"""


@pytest.mark.parametrize("kind", ["http", "control"])
def test_out_of_descriptors_refuses_cleanly_logs_little_and_recovers(kind, sock_dir):
    result = subprocess.run([sys.executable, "-c", SCRIPT, kind, str(sock_dir), str(ATTEMPTS), str(STEP_S)],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout, (result.stdout, result.stderr[-3000:])
    out = json.loads(result.stdout)
    log_lines = result.stderr.splitlines()

    assert "fine" in out["before"], out["before"]
    # Every client was told at once and the connection closed; none was left hanging.
    refusal = "503 Service Unavailable" if kind == "http" else '"ok": false'
    odd = [reply for reply in out["replies"] if refusal not in reply or "out of file descriptors" not in reply]
    assert not odd, odd

    # One warning, then one per REPORT_EVERY_S of the clock at most, and one line when it is over.
    warnings = [line for line in log_lines if line.startswith("WARNING")]
    assert 1 <= len(warnings) <= 1 + math.ceil(out["span_s"] / REPORT_EVERY_S), warnings
    assert all("Too many open files" in line for line in warnings), warnings
    assert len(log_lines) <= len(warnings) + 3, log_lines  # the listener's own info lines, "accepting again"

    # Counted for status, and a working accept ends the shortage.
    short = out["stats_short"]
    assert short["accept_failing"] is True and short["refused"] == ATTEMPTS
    assert 1 <= short["accept_failures"] <= ATTEMPTS and short["accept_error"] == "Too many open files"
    assert short["last_accept_failure"] is not None
    if kind == "http":
        assert out["after"].startswith("HTTP/1.1 200 OK") and out["after"].endswith("fine\n"), out["after"]
    else:
        assert json.loads(out["after"]) == {"ok": True, "fine": 1}
    assert out["stats_after"]["accept_failing"] is False
    assert any("accepting connections again" in line for line in log_lines), log_lines

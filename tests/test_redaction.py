"""Credentials never leave the process: the URL parser, the secret registry, and every output channel
of the real daemon (log, `yoloedge-ctl status` table and JSON, retained camera states, stats
messages, `check`, a rejected reload) searched for the secrets of a table of hostile camera URLs.

Every secret in the tables is built from markers like `Q7zA` that appear nowhere else, so a test
can search for each marker: a partial leak (the tail of a password after a '/') is caught too.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import Subscriber
from daemon_harness import REPO, Daemon, NotifySocket, ctl, write_config
from fixtures_media import free_port
from servers.mjpeg_server import MjpegServer
from yoloedge import demo
from yoloedge.config.fields import show
from yoloedge.control.client import request
from yoloedge.health.logsetup import RedactingFilter, make_handler
from yoloedge.redact import (MASK, SECRETS, SHOWN_KEYS, SecretRegistry, is_shown_key, redact_text, redact_url,
                             split_url, url_secrets)

PREFIX = "yr"
DEVICE = "edge9"
MQTT_USER = "edge"
MQTT_PASSWORD = "MqttQ99zA-pw"


# --- the parser ----------------------------------------------------------------------------------

@pytest.mark.parametrize("url, expected", [
    ("rtsp://admin:secret@10.0.0.5:554/stream", "rtsp://***@10.0.0.5:554/stream"),
    ("rtsp://me@mail.com:pw@cam/s", "rtsp://***@cam/s"),
    ("rtsp://admin:pa ss@cam/s", "rtsp://***@cam/s"),
    ("rtsp://admin:123/456@cam/", "rtsp://***@cam/"),
    ("rtsp://admin:a/b?c#d@cam:8554/s?ch=1", "rtsp://***@cam:8554/s?ch=1"),
    ("http://cam/video.cgi?user=admin&pwd=secret", "http://cam/video.cgi?user=***&pwd=***"),
    ("http://cam/v?USER=a&PassWord=b&channel=1", "http://cam/v?USER=***&PassWord=***&channel=1"),
    ("https://cam/v?x_api_key=k&X-Api-Key=k&access_token=t", "https://cam/v?x_api_key=***&X-Api-Key=***&access_token=***"),
    ("https://cam/v?Signature=s&X-Amz-Credential=c&sig=s", "https://cam/v?Signature=***&X-Amz-Credential=***&sig=***"),
    ("http://cam/v?pwd=a&b&res=hd", "http://cam/v?pwd=***&***&res=hd"),
    ("http://cam/v?p%61ss=x", "http://cam/v?p%61ss=***"),
    ("http://cam/v?pwd=a/b#token=t", "http://cam/v?pwd=***#token=***"),
    ("http://cam/v;jsessionid=abc?a=1", "http://cam/v;jsessionid=***?a=***"),
    ("rtsp://cam/user=admin_password=x_channel=1_stream=0.sdp", "rtsp://cam/user=***_password=***_channel=1_stream=0.sdp"),
    ("rtsp://u:p@[::1]:8554/s", "rtsp://***@[::1]:8554/s"),
    ("rtsp://[fe80::1%25eth0]:554/s", "rtsp://[fe80::1%25eth0]:554/s"),
    ("rtsp://admin:secret", "rtsp://admin:***"),
    ("rtsp://token@cam/s", "rtsp://***@cam/s"),
    ("rtsp://user:@cam/s", "rtsp://***@cam/s"),
    ("rtsp://ünï:çødé€@cam/s", "rtsp://***@cam/s"),
    ("RTMP://a:b@cam/live", "RTMP://***@cam/live"),
    ("http://cam/x?a=b%3Ac%40d&fps=5", "http://cam/x?a=***&fps=5"),
    # any name not on the allowlist, in any language or abbreviation
    ("http://h/video.cgi?usr=admin&psw=s", "http://h/video.cgi?usr=***&psw=***"),
    ("http://h/v?pswd=s&pword=s&code=s&digest=s", "http://h/v?pswd=***&pword=***&code=***&digest=***"),
    ("http://h/v?access=s&otp=s&nonce=s&ticket=s", "http://h/v?access=***&otp=***&nonce=***&ticket=***"),
    ("https://h/v?ak=s&sk=s&channel=2", "https://h/v?ak=***&sk=***&channel=2"),
    ("http://h/v?Kennwort=s&contrasena=s&contrase%C3%B1a=s", "http://h/v?Kennwort=***&contrasena=***&contrase%C3%B1a=***"),
    ("http://h/v?x9=s&fps=5", "http://h/v?x9=***&fps=5"),
    ("http://h/snap.jpg?AbC123&tcp", "http://h/snap.jpg?***&tcp"),  # a bare token, a bare flag
    ("http://h/v?x9=s&tcp", "http://h/v?x9=***&***"),  # continues the hidden value
    ("http://h/v#s", "http://h/v#***"),
    ("rtsp://h/psw=s/live", "rtsp://h/psw=***/***"),
    ("synthetic://640x480?fps=5&image=/srv/a.png", "synthetic://640x480?fps=5&image=/srv/a.png"),
    ("file:///srv/videos/gate.mp4", "file:///srv/videos/gate.mp4"),
    ("/dev/video0", "/dev/video0"),
    ("relative/clip.mp4", "relative/clip.mp4"),
    # a scheme forgotten or mistyped: a ':' before an '@', in any path segment
    ("admin:pw@cam/s", "***@cam/s"),
    ("rtsp//admin:pw@cam/s", "***@cam/s"),
    ("rtsp/admin:pw@cam", "***@cam"),
    ("rtsp;//admin:pw@cam/s", "***@cam/s"),
    ("rtsp.//admin:pw@cam/s", "***@cam/s"),
    ("RTSP//admin:pw@cam/s", "***@cam/s"),
    ("/etc/yoloedge/rtsp/admin:p@w@cam/s", "***@cam/s"),  # resolved from the config file's folder
    ("/data/cam@2/v.mp4", "/data/cam@2/v.mp4"),  # no ':' before the '@': an ordinary path
])
def test_display_form(url, expected):
    assert redact_url(url) == expected
    assert redact_url(expected) == expected  # a display form is already safe


def test_split_takes_the_userinfo_up_to_the_last_at_sign():
    parts = split_url("rtsp://me@mail.com:p@ss/w?rd#x@[::1]:8554/s?q=1")
    assert parts is not None
    assert (parts.scheme, parts.userinfo, parts.host, parts.port, parts.rest) == (
        "rtsp", "me@mail.com:p@ss/w?rd#x", "[::1]", "8554", "/s?q=1")
    assert split_url("/dev/video0") is None and split_url("://cam") is None


@pytest.mark.parametrize("key", ["user", "Username", "USR", "pass", "Password", "passwd", "pwd", "PW",
                                 "token", "access_token", "key", "apikey", "api_key", "x_api_key", "X-Api-Key",
                                 "auth", "Authorization", "sig", "signature", "secret", "client_secret",
                                 "credential", "credentials", "session", "JSESSIONID", "sid", "email",
                                 "loginuse", "loginpas", "p%61ss", "psw", "pswd", "pword", "code", "digest",
                                 "access", "otp", "nonce", "ticket", "ak", "sk", "Kennwort", "contrasena",
                                 "contrase%C3%B1a", "x9", "a", "", "channelx", "rs"])
def test_any_other_key_is_hidden(key):
    assert not is_shown_key(key)


@pytest.mark.parametrize("key", ["fps", "channel", "stream", "resolution", "subtype", "image", "width",
                                 "RTSP_Transport", "videocodec", "c%68annel"])
def test_ordinary_keys(key):
    assert is_shown_key(key)


@pytest.mark.parametrize("url", [
    "rtsp://***@cam:554/Streaming/Channels/101?transportmode=unicast&profile=Profile_1",  # Hikvision
    "rtsp://***@cam/cam/realmonitor?channel=1&subtype=0&unicast=true&proto=Onvif",  # Dahua, Amcrest
    "rtsp://***@cam/axis-media/media.amp?videocodec=h264&resolution=640x480&fps=15&camera=1&compression=30",
    "http://cam/axis-cgi/mjpg/video.cgi?resolution=320x240&camera=2&streamprofile=Balanced",  # Axis
    "rtsp://***@cam:554/h264Preview_01_main",  # Reolink
    "http://cam:88/cgi-bin/CGIStream.cgi?cmd=GetMJStream&usr=***&pwd=***",  # Foscam
    "rtsp://***@cam/live.sdp?tcp",  # Vivotek
    "rtsp://***@cam/onvif1?stream=0&streamtype=main&audio=0&video=1&trackid=2",  # ONVIF, generic
    "udp://239.0.0.1:1234?pkt_size=1316&fifo_size=100000&overrun_nonfatal=1",  # FFmpeg options
    "rtsp://cam/user=***_password=***_channel=1_stream=0.sdp",
])
def test_allowlisted_parameters_of_real_camera_urls_stay_readable(url):
    """The display forms of real camera URL conventions: everything but the credentials readable.
    Each one is its own display form, so nothing beyond the credentials was hidden."""
    assert redact_url(url) == url
    raw = url.replace("***@", "admin:Pw9@").replace("=***", "=Pw9")
    assert redact_url(raw) == url


def test_the_docs_list_the_allowlist_the_code_uses():
    text = (REPO / "docs" / "operations" / "checking-config.md").read_text()
    listed = text[text.index("The allowlist, in any case"):text.index("That covers the usual")]
    names = {name.replace("_", "") for name in re.findall(r"`([a-z][a-z_]*)`", listed)}
    assert names == set(SHOWN_KEYS)


def test_url_secrets_cover_raw_and_decoded_forms():
    url = "rtsp://me%40corp:p%2Fw0rd+x@cam/s?token=t%2Bok3n"
    pairs = dict(url_secrets(url))
    assert pairs[url] == "rtsp://***@cam/s?token=***"
    assert pairs["rtsp://me@corp:p/w0rd+x@cam/s?token=t+ok3n"] == "rtsp://***@cam/s?token=***"
    for form in ("p%2Fw0rd+x", "p/w0rd+x", "p/w0rd x", "t%2Bok3n", "t+ok3n", "me@corp:p/w0rd+x"):
        assert pairs[form] == MASK, form


@pytest.mark.parametrize("text, expected", [
    ("cannot open 'rtsp://u:p'w@cam/1': timeout", "cannot open 'rtsp://***@cam/1': timeout"),
    ("https://cam/v?token=abc: cannot open stream", "https://cam/v?token=***: cannot open stream"),
    ("urls (rtsp://a:b@c/1, rtsp://d:e@f/2).", "urls (rtsp://***@c/1, rtsp://***@f/2)."),
    ("unsupported scheme rtmp://: use rtsp://", "unsupported scheme rtmp://: use rtsp://"),
    ("no url here: user=admin pwd=x", "no url here: user=admin pwd=x"),
])
def test_urls_in_prose(text, expected):
    assert redact_text(text, SecretRegistry()) == expected


def test_registry_scrubs_text_that_no_url_pattern_can_find():
    registry = SecretRegistry()
    url = "rtsp://admin:pa ss'w0rd@cam/s"
    registry.add_url(url)
    registry.add_secret("hunter22")
    text = f"open failed for {url}; then for 'pa ss'w0rd' and pa ss'w0rd alone; mqtt hunter22"
    out = redact_text(text, registry)
    assert "pa ss" not in out and "w0rd" not in out and "hunter22" not in out
    assert "rtsp://***@cam/s" in out  # the host is still named


def test_registry_is_safe_to_use_from_many_threads():
    registry = SecretRegistry()
    errors: list[BaseException] = []

    def add(n: int) -> None:
        try:
            for i in range(200):
                registry.add_secret(f"secret-{n}-{i}")
                registry.scrub(f"x secret-{n}-{i} y")
        except BaseException as exc:  # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(registry.pairs()) == 800
    assert registry.scrub("a secret-3-199 b") == "a *** b"


def test_log_filter_uses_the_process_registry():
    SECRETS.add_url("rtsp://admin:Fz9 q/w?e@cam/s")
    record = logging.makeLogRecord({"msg": "ffmpeg said: %s", "args": ("cannot open Fz9 q/w?e",)})
    assert RedactingFilter().filter(record)
    assert "Fz9" not in record.getMessage() and MASK in record.getMessage()


@pytest.mark.parametrize("value, expected", [
    ("rtsp://admin:p w/d?x#y@cam/s", "'rtsp://***@cam/s'"),
    ("see rtsp://a:b@cam/s and more", "'see rtsp://***@cam/s and more'"),
    ("://admin:secret@cam", "'***'"),
    ("plain text", "'plain text'"),
    ("admin:p w/d@cam/s", "'***@cam/s'"),  # the scheme forgotten
    ("//me:p/w@cam/s", "'***@cam/s'"),
    ("rtsp//admin:p w@cam/s", "'***@cam/s'"),  # the scheme mistyped
    ("/srv/cam@2x/clip.mp4", "'/srv/cam@2x/clip.mp4'"),  # a path is not an address
])
def test_show_never_echoes_a_secret_part(value, expected):
    assert show(value) == expected


# --- hostile URLs, every output channel of the real daemon ---------------------------------------

@dataclass(frozen=True)
class Hostile:
    """A camera URL (`{port}`: a closed port; `{mjpeg}`: the MJPEG server's) and the markers of its
    secrets, none of which may appear in any output."""

    name: str
    url: str
    markers: tuple[str, ...]
    host: str = "127.0.0.1"  # what the display form must still show


HOSTILE = [
    Hostile("email_user", "rtsp://U1zA@mail.example:Q1zA@127.0.0.1:{port}/s", ("U1zA", "Q1zA")),
    Hostile("space", "rtsp://admin:Q2zA Q2zB@127.0.0.1:{port}/s", ("Q2zA", "Q2zB")),
    Hostile("digits_slash", "rtsp://admin:64999/Q3zA@127.0.0.1:{port}/s", ("Q3zA", "admin:64999", "64999/")),
    Hostile("digits_question", "rtsp://admin:1?Q4zA@127.0.0.1:{port}/s", ("Q4zA",)),
    Hostile("digits_hash", "rtsp://admin:2#Q5zA@127.0.0.1:{port}/s", ("Q5zA",)),
    Hostile("colon", "rtsp://admin:Q6zA:Q6zB@127.0.0.1:{port}/s", ("Q6zA", "Q6zB")),
    Hostile("pct_at", "rtsp://admin:Q7zA%40Q7zB@127.0.0.1:{port}/s", ("Q7zA", "Q7zB")),
    Hostile("pct_slash", "rtsp://admin:Q8zA%2FQ8zB@127.0.0.1:{port}/s", ("Q8zA", "Q8zB")),
    Hostile("at_in_password", "http://admin:Q9zA@Q9zB@127.0.0.1:{mjpeg}/a.mjpg", ("Q9zA", "Q9zB")),
    Hostile("query_cgi", "http://127.0.0.1:{mjpeg}/video.cgi?user=U10zA&pwd=Q10zA", ("U10zA", "Q10zA")),
    Hostile("query_upper", "http://127.0.0.1:{mjpeg}/snap.mjpg?USER=U11zA&PassWord=Q11zA&channel=1",
            ("U11zA", "Q11zA")),
    Hostile("query_api_key", "https://127.0.0.1:{port}/live?x_api_key=Q12zA&access_token=Q12zB", ("Q12zA", "Q12zB")),
    Hostile("query_repeated", "http://127.0.0.1:{mjpeg}/s.mjpg?pwd=Q13zA&pwd=Q13zB&auth=Q13zC",
            ("Q13zA", "Q13zB", "Q13zC")),
    Hostile("fragment", "http://127.0.0.1:{port}/s#token=Q14zA", ("Q14zA",)),
    Hostile("ipv6", "rtsp://admin:Q15zA@[::1]:{port}/s", ("Q15zA",), host="[::1]"),
    Hostile("empty_password", "rtsp://U16zA:@127.0.0.1:{port}/s", ("U16zA",)),
    Hostile("user_only_token", "rtsp://Q17zA@127.0.0.1:{port}/s", ("Q17zA",)),
    Hostile("unicode", "rtsp://admin:Q18zÄ€ß@127.0.0.1:{port}/s", ("Q18z",)),
    Hostile("path_params", "rtsp://127.0.0.1:{port}/user=U19zA_password=Q19zA_channel=1_stream=0.sdp",
            ("U19zA", "Q19zA")),
    Hostile("rtsps_mixed", "rtsps://me@x.org:1/Q20zA?@127.0.0.1:{port}/s?sig=Q20zB", ("Q20zA", "Q20zB")),
    Hostile("ampersand_in_query_password", "http://127.0.0.1:{port}/cgi?pwd=Q21zA&Q21zB&res=hd", ("Q21zA", "Q21zB")),
    Hostile("signature", "https://127.0.0.1:{port}/v?Signature=Q22zA&X-Amz-Credential=Q22zB", ("Q22zA", "Q22zB")),
    Hostile("session_path_param", "http://127.0.0.1:{port}/v;jsessionid=Q23zA?a=1", ("Q23zA",)),
    Hostile("encoded_key", "http://127.0.0.1:{port}/v?p%61ss=Q24zA", ("Q24zA",)),
    Hostile("bad_percent", "rtsp://admin:Q25zA%zzQ25zB@127.0.0.1:{port}/s", ("Q25zA", "Q25zB")),
    Hostile("plus_space", "http://127.0.0.1:{mjpeg}/a.mjpg?password=Q26zA+Q26zB", ("Q26zA", "Q26zB")),
    # names no list of credential names had: only an allowlist of harmless ones hides them all
    Hostile("dvr_psw", "http://127.0.0.1:{mjpeg}/video.cgi?usr=U27zA&psw=Q27zA", ("U27zA", "Q27zA")),
    Hostile("pswd_pword", "http://127.0.0.1:{port}/v.cgi?pswd=Q28zA&pword=Q28zB&channel=1", ("Q28zA", "Q28zB")),
    Hostile("code_digest_access", "https://127.0.0.1:{port}/v?code=Q29zA&digest=Q29zB&access=Q29zC",
            ("Q29zA", "Q29zB", "Q29zC")),
    Hostile("otp_nonce_ticket", "https://127.0.0.1:{port}/v?otp=Q30zA&nonce=Q30zB&ticket=Q30zC",
            ("Q30zA", "Q30zB", "Q30zC")),
    Hostile("ak_sk", "https://127.0.0.1:{port}/v?ak=Q31zA&sk=Q31zB&fps=5", ("Q31zA", "Q31zB")),
    Hostile("other_languages", "http://127.0.0.1:{port}/v?Kennwort=Q32zA&contrasena=Q32zB&contrase%C3%B1a=Q32zC",
            ("Q32zA", "Q32zB", "Q32zC")),
    Hostile("unknown_key_and_bare_token", "http://127.0.0.1:{port}/v?x9=Q33zA&channel=2&Q33zB", ("Q33zA", "Q33zB")),
]

#: values that `check` and a reload must reject, quoting none of their secrets.
REJECTED = [
    ("rtsp://admin:R1zA?R1zB@127.0.0.1:554/s", ("R1zA", "R1zB")),  # '?' in the password: port 'R1zA'
    ("rtsp://admin:R2zA#R2zB@127.0.0.1/s", ("R2zA", "R2zB")),
    ("rtsp://admin:R3zA/R3zB@127.0.0.1/s", ("R3zA", "R3zB")),
    ("rtsps://me@x.org:R4zA/?#@127.0.0.1/s?sig=R4zB", ("R4zA", "R4zB")),
    ("rtmp://admin:R5zA@cam.local/live", ("R5zA",)),  # unsupported scheme
    ("rtsp://admin:R6zA", ("R6zA",)),  # host forgotten
    ("rtsp://admin:R7zA@", ("R7zA",)),  # no host
    ("gopher://u:R8zA R8zB@cam/?token=R8zC", ("R8zA", "R8zB", "R8zC")),
    ("admin:R9zA@127.0.0.1/stream", ("R9zA",)),  # scheme forgotten
    ("//me:R10zA/R10zB@127.0.0.1/stream", ("R10zA", "R10zB")),
    ("rtmp://127.0.0.1/live?psw=R11zA&Kennwort=R11zB", ("R11zA", "R11zB")),
    # a mistyped scheme: would be opened as a file path
    ("rtsp//admin:R12zA@127.0.0.1/s", ("R12zA",)),
    ("rtsp/admin:R13zA@127.0.0.1", ("R13zA",)),
    ("rtsp;//admin:R14zA@127.0.0.1/s", ("R14zA",)),
    ("rtsp.//admin:R15zA@127.0.0.1/s", ("R15zA",)),
    ("RTSP//admin:R16zA@127.0.0.1/s", ("R16zA",)),
]

#: an mqtt.host that is a URL with credentials: refused, and the whole value registered as secret.
BAD_MQTT_HOST = "admin:H1zA@127.0.0.1"

MARKERS = ([m for h in HOSTILE for m in h.markers] + [m for _, ms in REJECTED for m in ms]
           + [MQTT_PASSWORD, "Q99zA", "H1zA"])


def leaks(text: str) -> list[str]:
    return [marker for marker in MARKERS if marker in text]


def test_journal_entries_show_no_secret(tmp_path):
    """The journald handler gets what the log filter left: every hostile URL quoted raw, in prose
    and in a traceback, as FFmpeg or an exception might, once the configuration has registered it."""
    path = str(tmp_path / "journal")
    logger = logging.getLogger("yoloedge.test_redaction")
    logger.propagate = False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(path)
        sock.settimeout(5)
        handler = make_handler("journald", {}, journal_socket=path)
        logger.addHandler(handler)
        try:
            datagrams = []
            for h in HOSTILE:
                url = h.url.format(port=554, mjpeg=8080)
                SECRETS.add_url(url)
                try:
                    raise OSError(f"[tcp @ 0x55] cannot open '{url}': Connection refused")
                except OSError:
                    logger.exception("camera %s: open %s failed", h.name, url)
                datagrams.append(sock.recv(65536).decode("utf-8", "replace"))
        finally:
            logger.removeHandler(handler)
            handler.close()
    text = "\n".join(datagrams)
    assert "Traceback" in text and "127.0.0.1" in text
    assert not leaks(text), leaks(text)


def test_the_tables_are_as_large_as_promised():
    assert len(HOSTILE) >= 20 and len({h.name for h in HOSTILE}) == len(HOSTILE)
    assert len(set(MARKERS)) == len(MARKERS)


def cameras(port: int, mjpeg: int) -> list[dict]:
    return [{"name": h.name, "url": h.url.format(port=port, mjpeg=mjpeg), "open_timeout_s": 1,
             "read_timeout_s": 2, "backoff_initial_s": 0.2, "backoff_max_s": 0.5} for h in HOSTILE]


def daemon_config(tmp_path: Path, broker, cams: list[dict]) -> dict:
    return {
        "device_id": DEVICE,
        "model": {"path": str(demo.MODEL), "labels": str(demo.LABELS)},
        "accelerators": [{"name": "sim", "backend": "simulated", "batch": 4, "simulated": {"device_ms": [1, 1]}}],
        "cameras": cams,
        "mqtt": {"host": broker.host, "port": broker.port, "topic_prefix": PREFIX, "username": MQTT_USER,
                 "password": MQTT_PASSWORD, "stats_interval_s": 1, "reconnect_min_s": 0.5, "reconnect_max_s": 2},
        "health": {"stall_timeout_s": 3, "status_interval_s": 1},
        "control": {"socket": str(tmp_path / "run" / "control.sock")},
        "logging": {"level": "debug", "target": "stderr"},
        "shutdown_timeout_s": 10,
    }


def check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "yoloedge", "check", "-c", str(path)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def wait_until_every_camera_reported(sock: str, timeout: float) -> dict | None:
    """The daemon's own status reply once every camera streams or has an error; None on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = request(sock, {"cmd": "status"})
        cams = {c["name"]: c for c in report["cameras"]}
        if all(cams[h.name]["error"] or cams[h.name]["state"] == "streaming" for h in HOSTILE):
            return report
        time.sleep(0.5)
    return None


@pytest.fixture()
def mjpeg():
    server = MjpegServer.from_video(demo.clip_path(), fps=5, max_frames=10).start()
    yield server
    server.stop()


def rejected_config(config: dict) -> dict:
    """`config` with each REJECTED url on a camera of its own, a bad value next to a hostile one,
    and BAD_MQTT_HOST."""
    bad = [{"name": f"rejected{i}", "url": url} for i, (url, _) in enumerate(REJECTED)]
    neighbour = dict(config["cameras"][0], name="neighbour", fps=-1)
    return dict(config, cameras=config["cameras"] + bad + [neighbour], mqtt=dict(config["mqtt"], host=BAD_MQTT_HOST))


def test_no_output_channel_shows_a_secret(tmp_path, mosquitto_factory, mjpeg):
    broker = mosquitto_factory(users={MQTT_USER: MQTT_PASSWORD})
    live = Subscriber.for_broker(broker, ("#",)).start()
    notify = NotifySocket(tmp_path / "notify.sock")
    config = daemon_config(tmp_path, broker, cameras(free_port(), mjpeg.port))
    path = write_config(tmp_path / "yoloedge.yaml", config)
    assert check(path).returncode == 0, check(path).stderr
    daemon = Daemon(path, notify)
    try:
        notify.wait_for("READY", "1", timeout=60)
        sock = config["control"]["socket"]
        stats_topic = f"{PREFIX}/{DEVICE}/stats"
        report = wait_until_every_camera_reported(sock, 60)
        assert report is not None, daemon.log[-3000:]
        assert live.wait_for(lambda ms: len([m for m in ms if m.topic == stats_topic]) >= 2, 20)
        by_name = {c["name"]: c for c in report["cameras"]}
        for h in HOSTILE:  # not vacuous: each URL is shown, host and all
            shown = by_name[h.name]["url"]
            assert h.host in shown and MASK in shown, (h.name, shown)
        streaming = [h.name for h in HOSTILE if by_name[h.name]["state"] == "streaming"]
        assert "query_cgi" in streaming and "at_in_password" in streaming, report["cameras"]

        bad_path = write_config(tmp_path / "bad.yaml", rejected_config(config))
        checked = check(bad_path)
        assert checked.returncode == 78
        for i in range(len(REJECTED)):
            assert f"cameras[{len(HOSTILE) + i}].url" in checked.stderr, checked.stderr
        assert f"cameras[{len(HOSTILE) + len(REJECTED)}].fps" in checked.stderr
        assert "mqtt.host" in checked.stderr

        path.write_text(bad_path.read_text())
        daemon.signal(signal.SIGHUP)
        notify.wait_for("READY", "1", timeout=30, count=2)
        after = request(sock, {"cmd": "status"})
        assert after["daemon"]["generation"] == 1 and after["daemon"]["config_error"]
        assert "cameras[" in after["daemon"]["config_error"]
        table = ctl(sock, "status")
        as_json = ctl(sock, "status", "--json")
        assert "reload rejected" in daemon.log and "email_user" in table.stdout

        late = Subscriber.for_broker(broker, (f"{PREFIX}/{DEVICE}/cameras/+/state",)).start()
        assert late.wait_for(lambda ms: len({m.topic for m in ms if m.retain}) >= len(HOSTILE), 10)
        retained = [m for m in late.messages() if m.retain]  # live changes arrive too
        late.stop()
        assert daemon.stop() == 0, daemon.log[-3000:]
    finally:
        daemon.kill()
        live.stop()
        notify.close()

    channels = {
        "daemon log": daemon.log,
        "ctl status": table.stdout + table.stderr,
        "ctl status --json": as_json.stdout + as_json.stderr,
        "control socket (status after the rejected reload)": json.dumps(report) + json.dumps(after),
        "check": checked.stdout + checked.stderr,
        "retained states": "\n".join(m.payload.decode("utf-8", "replace") for m in retained),
        "every MQTT message": "\n".join(f"{m.topic} {m.payload.decode('utf-8', 'replace')}"
                                        for m in live.messages()),
    }
    assert len(live.messages(stats_topic)) >= 2
    found = {channel: leaks(text) for channel, text in channels.items() if leaks(text)}
    assert not found, found


# --- mqtt.host: a host, nothing else -------------------------------------------------------------

@pytest.mark.parametrize("host, markers", [
    ("admin:H2zA@127.0.0.1", ("H2zA",)),
    ("mqtt://u:H3zA@broker.lan:1883", ("H3zA",)),
    ("broker.lan/psw=H4zA", ("H4zA",)),
    ("H5zA H5zB@broker", ("H5zA", "H5zB")),
    ("broker:1883", ()),
    ("[::1]:1883", ()),
    ("-broker", ()),
])
def test_mqtt_host_that_is_not_a_host_exits_78_without_echo(tmp_path, host, markers):
    path = write_config(tmp_path / "c.yaml", {"device_id": "e", "model": {"path": str(demo.MODEL)},
                                              "mqtt": {"host": host}})
    checked = check(path)
    assert checked.returncode == 78, checked.stderr
    assert f"{path}:" in checked.stderr and "mqtt.host" in checked.stderr, checked.stderr
    assert "mqtt.username" in checked.stderr or "mqtt.port" in checked.stderr, checked.stderr
    assert host not in checked.stdout + checked.stderr
    assert not [m for m in markers if m in checked.stdout + checked.stderr], checked.stderr


def test_a_refused_mqtt_host_is_scrubbed_from_later_log_lines(tmp_path):
    """A rejected reload is logged by the running daemon; anything that quotes the refused value
    afterwards (paho, a traceback) goes through the log filter, which must know it."""
    from yoloedge.config.errors import ConfigError
    from yoloedge.config.loader import load_config

    path = write_config(tmp_path / "c.yaml", {"device_id": "e", "model": {"path": str(demo.MODEL)},
                                              "mqtt": {"host": "operator:H6zA H6zB@127.0.0.1"}})
    with pytest.raises(ConfigError) as caught:
        load_config(str(path), {})
    assert "H6z" not in str(caught.value)
    record = logging.makeLogRecord({"msg": "connecting to %s failed; password %s",
                                    "args": ("operator:H6zA H6zB@127.0.0.1:1883", "H6zA H6zB")})
    assert RedactingFilter().filter(record)
    assert "H6z" not in record.getMessage() and MASK in record.getMessage(), record.getMessage()


@pytest.mark.parametrize("host, expected", [
    ("broker.lan", "broker.lan"), ("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("[2001:db8::1]", "2001:db8::1"),
    ("fe80::1%eth0", "fe80::1%eth0"), ("mqtt_broker.", "mqtt_broker."), ("localhost", "localhost"),
])
def test_mqtt_host_names_and_addresses_are_taken(tmp_path, host, expected):
    from yoloedge.config.loader import load_config

    path = write_config(tmp_path / "c.yaml", {"device_id": "e", "model": {"path": str(demo.MODEL)},
                                              "mqtt": {"host": host}})
    assert load_config(str(path), {}).mqtt.host == expected


def test_verify_names_a_missing_url_input_without_its_secrets():
    from yoloedge.verify import read_inputs

    problems = read_inputs(["rtsp://admin:V1zA@127.0.0.1/s", "admin:V2zA@127.0.0.1/s"], 1).problems
    assert problems == ["not found: rtsp://***@127.0.0.1/s", "not found: ***@127.0.0.1/s"]

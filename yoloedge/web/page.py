"""`GET /`: the status page, one self-contained HTML document.

No build step and nothing fetched from elsewhere: an appliance on a closed network must show it,
so the CSS and the script are inline. The page polls `/api/status` every two seconds and shows
each camera's latest annotated frame from `/api/cameras/<name>/latest.jpg`, asked for only when
the camera has published a frame since the last one (an idle camera costs no JPEG encoding, and
a camera without a frame yet shows a placeholder rather than a stream of 503s).

Everything from the status (camera names, errors, problems) reaches the page through
`textContent` and `encodeURIComponent`, never as markup: a camera name may hold `<`, `&` or `"`.
The Content-Security-Policy allows only this document's own inline script and style (by a nonce
made per reply) and same-origin requests, so even a mistake there could not load or run
anything else.
"""

from __future__ import annotations

import secrets
from http import HTTPStatus

from .server import Request, Response

#: how often the page asks for `/api/status`, in milliseconds
POLL_MS = 2000


def csp(nonce: str) -> str:
    return ("default-src 'self'; "
            f"script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
            "img-src 'self'; connect-src 'self'; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


def status_page(request: Request) -> Response:
    """The route for `/`: a fresh nonce per reply, so a cached copy cannot be replayed with it."""
    nonce = secrets.token_urlsafe(18)
    body = PAGE.replace("{{NONCE}}", nonce).replace("{{POLL_MS}}", str(POLL_MS)).encode("utf-8")
    headers = (("Content-Security-Policy", csp(nonce)),
               ("Referrer-Policy", "no-referrer"),
               ("X-Frame-Options", "DENY"))
    return Response(HTTPStatus.OK, body, "text/html; charset=utf-8", headers)


#: a browser asks for `/favicon.ico` whatever the page says; a 404 there is an error in its console
ICON = (b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
        b'<rect x="2" y="3" width="12" height="10" fill="none" stroke="#e53935" stroke-width="2"/></svg>')


def icon(request: Request) -> Response:
    return Response(HTTPStatus.OK, ICON, "image/svg+xml", (("Content-Security-Policy", "default-src 'none'"),))


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>yoloedge</title>
<link rel="icon" href="/favicon.ico" type="image/svg+xml">
<style nonce="{{NONCE}}">
:root { color-scheme: light dark; --ok: #1a7f37; --bad: #c62828; --dim: #888; --line: #8884; }
body { font: 14px/1.4 system-ui, sans-serif; margin: 0 auto; padding: 1em; max-width: 1400px; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
.sub, .dim { color: var(--dim); }
.ok { color: var(--ok); } .bad { color: var(--bad); }
#problems li { color: var(--bad); }
#cameras { display: grid; grid-template-columns: repeat(auto-fill, minmax(320px, 1fr)); gap: 1em; }
.camera { border: 1px solid var(--line); border-radius: 6px; padding: .6em; overflow-wrap: anywhere; }
.camera h3 { font-size: 1em; margin: 0 0 .3em; }
.frame { aspect-ratio: 16 / 9; background: #8882; display: flex; align-items: center;
         justify-content: center; margin-top: .4em; }
.frame img { max-width: 100%; max-height: 100%; }
.hidden { display: none; }
table { border-collapse: collapse; }
td, th { text-align: left; padding: .2em .8em .2em 0; border-bottom: 1px solid var(--line); }
</style>
</head>
<body>
<h1>yoloedge <span id="device"></span></h1>
<div class="sub" id="daemon">loading&hellip;</div>
<div class="bad hidden" id="unreachable"></div>
<h2>Problems</h2>
<ul id="problems"></ul>
<h2>Cameras</h2>
<div id="cameras"></div>
<h2>Devices</h2>
<table><thead><tr><th>device</th><th>accelerator</th><th>state</th><th>frames/s</th>
<th>inferences/s</th><th>utilisation</th><th>p50</th><th>health</th></tr></thead>
<tbody id="devices"></tbody></table>
<h2>MQTT</h2>
<div id="mqtt"></div>
<script nonce="{{NONCE}}">
"use strict";
const POLL_MS = {{POLL_MS}};
const cards = new Map();  // camera name -> {root, fields, img, placeholder, shownFor, loading}

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}
function num(value, digits, unit) {
  return typeof value === "number" && isFinite(value) ? value.toFixed(digits) + (unit || "") : "\\u2013";
}
function replaceChildren(parent, children) {
  while (parent.firstChild) parent.removeChild(parent.firstChild);
  for (const child of children) parent.appendChild(child);
}

function cameraCard(name) {
  const root = el("div", "camera");
  root.dataset.camera = name;
  root.appendChild(el("h3", "", name));
  const fields = el("div", "dim");
  root.appendChild(fields);
  const frame = el("div", "frame");
  const img = el("img", "hidden");
  img.alt = "latest processed frame of " + name;
  const placeholder = el("span", "dim placeholder", "no processed frame yet");
  frame.appendChild(img);
  frame.appendChild(placeholder);
  root.appendChild(frame);
  const card = {root, fields, img, placeholder, shownFor: -1, loading: false};
  img.addEventListener("load", () => {
    card.loading = false;
    img.classList.remove("hidden");
    placeholder.classList.add("hidden");
  });
  img.addEventListener("error", () => {  // 503 between frames of a reload: try again next poll
    card.loading = false;
    card.shownFor = -1;
    img.classList.add("hidden");
    placeholder.classList.remove("hidden");
  });
  return card;
}

function showCamera(card, cam) {
  const state = String(cam.state);
  const parts = [state, "in " + num(cam.fps_in, 1, " fps"), "out " + num(cam.fps_out, 1, " fps"),
                 "latency p50 " + num(cam.latency_p50_ms, 0, " ms") + ", p99 " + num(cam.latency_p99_ms, 0, " ms"),
                 "published " + (cam.published ?? 0), "dropped " + (cam.drops ?? 0)];
  if (cam.error) parts.push("error: " + cam.error);
  else if (cam.last_error) parts.push("last error (" + (cam.last_error_at ?? "?") + "): " + cam.last_error);
  card.fields.textContent = parts.join(" \\u00b7 ");
  card.fields.className = state === "streaming" ? "ok" : "dim";
  const published = typeof cam.published === "number" ? cam.published : 0;
  if (published > 0 && published !== card.shownFor && !card.loading) {
    card.shownFor = published;
    card.loading = true;
    card.img.src = "/api/cameras/" + encodeURIComponent(cam.name) + "/latest.jpg?t=" + Date.now();
  }
}

function showCameras(cameras) {
  const seen = new Set();
  const list = document.getElementById("cameras");
  for (const cam of cameras) {
    const name = String(cam.name);
    seen.add(name);
    let card = cards.get(name);
    if (!card) {
      card = cameraCard(name);
      cards.set(name, card);
      list.appendChild(card.root);
    }
    showCamera(card, cam);
  }
  for (const [name, card] of cards) {  // removed by a reload
    if (!seen.has(name)) { card.root.remove(); cards.delete(name); }
  }
}

function showDevices(devices) {
  replaceChildren(document.getElementById("devices"), devices.map((d) => {
    const row = el("tr");
    const cells = [d.name, d.accelerator, d.state, num(d.frames_per_s, 1), num(d.inferences_per_s, 1),
                   num(typeof d.utilisation === "number" ? d.utilisation * 100 : null, 0, " %"),
                   num(d.p50_ms, 1, " ms")];
    for (const text of cells) row.appendChild(el("td", "", text));
    const why = d.last_error || d.error;
    const health = d.healthy ? "healthy" : "unhealthy" + (why ? ": " + why : "");
    row.appendChild(el("td", d.healthy ? "ok" : "bad", health));
    return row;
  }));
}

function showMqtt(mqtt) {
  const node = document.getElementById("mqtt");
  if (!mqtt || Object.keys(mqtt).length === 0) { node.textContent = "no publisher"; node.className = "dim"; return; }
  const parts = [mqtt.connected ? "connected" : "not connected", "broker " + (mqtt.broker ?? "?"),
                 "queued " + (mqtt.queued ?? 0), "dropped " + (mqtt.dropped ?? 0),
                 "reconnects " + (mqtt.reconnects ?? 0)];
  if (mqtt.last_error) {  // error_active false: a past error, shown with when it was last seen
    const over = mqtt.error_active === false;
    parts.push((over ? "last error (over, " + (mqtt.last_error_at ?? "?") + "): " : "error: ") +
               mqtt.last_error);
  }
  node.textContent = parts.join(" \\u00b7 ");
  node.className = mqtt.connected ? "ok" : "bad";
}

function show(status) {
  const d = status.daemon || {};
  document.getElementById("device").textContent = d.device_id ? "\\u2013 " + d.device_id : "";
  document.title = "yoloedge" + (d.device_id ? " \\u2013 " + d.device_id : "");
  const daemon = document.getElementById("daemon");
  daemon.textContent = [d.state, d.healthy ? "healthy" : "unhealthy", "version " + d.version,
                        "up " + num(d.uptime_s, 0, " s"),
                        "updated " + new Date().toLocaleTimeString()].join(" \\u00b7 ");
  daemon.className = d.healthy ? "ok" : "bad";
  const problems = Array.isArray(d.problems) ? d.problems : [];
  replaceChildren(document.getElementById("problems"),
                  problems.length ? problems.map((p) => el("li", "", p)) : [el("span", "dim", "none")]);
  showCameras(Array.isArray(status.cameras) ? status.cameras : []);
  showDevices(Array.isArray(status.accelerators) ? status.accelerators : []);
  showMqtt(status.mqtt);
}

async function poll() {
  const note = document.getElementById("unreachable");
  try {
    const reply = await fetch("/api/status", {cache: "no-store"});
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    show(await reply.json());
    note.classList.add("hidden");
  } catch (err) {
    note.textContent = "cannot reach the daemon (" + err.message + "); retrying";
    note.classList.remove("hidden");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}
poll();
</script>
</body>
</html>
"""

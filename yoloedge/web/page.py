"""`GET /`: the status page, one self-contained HTML document.

No build step and nothing fetched from elsewhere: an appliance on a closed network must show it,
so the CSS and the script are inline. The page polls `/api/status` every two seconds and shows
each camera's latest annotated frame from `/api/cameras/<name>/latest.jpg`, asked for only when
the camera has published a frame since the last one (an idle camera costs no JPEG encoding, and
a camera without a frame yet shows a placeholder rather than a stream of 503s).

Over each frame an SVG draws the camera's zones (polygons) and lines (A and B at their ends and an
arrow across the middle pointing the way that counts as `in`), from the `zones` and `lines` of the
camera's status, in fractions of the frame; below it, their counts. The SVG's view box is the
frame's own size in pixels, laid exactly over the image, so what it draws is where the daemon
counts. The recent events (`/api/events`, polled with the status) are listed with their best
shots, each thumbnail asked for again only when its shot changed.

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
.frame { position: relative; }
.overlay { position: absolute; pointer-events: none; overflow: visible; }
.overlay text { font-family: system-ui, sans-serif; font-weight: 600; paint-order: stroke; stroke: #000b;
                stroke-width: 3px; vector-effect: non-scaling-stroke; }
.counts { font-size: .9em; margin-top: .3em; }
.thumb { width: 128px; height: 72px; object-fit: contain; background: #8882; display: block; }
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
<h2>Recent events</h2>
<div class="dim" id="events-note">none yet</div>
<table><thead><tr><th>snapshot</th><th>camera</th><th>event</th><th>label</th><th>state</th>
<th>started</th><th>for</th><th>zones</th><th>crossings</th></tr></thead>
<tbody id="events"></tbody></table>
<h2>Devices</h2>
<table><thead><tr><th>device</th><th>accelerator</th><th>state</th><th>frames/s</th>
<th>inferences/s</th><th>utilisation</th><th>p50</th><th>health</th></tr></thead>
<tbody id="devices"></tbody></table>
<h2>MQTT</h2>
<div id="mqtt"></div>
<script nonce="{{NONCE}}">
"use strict";
const POLL_MS = {{POLL_MS}};
const cards = new Map();  // camera name -> {root, fields, img, placeholder, shownFor, loading, overlay, counts, cam}
const eventRows = new Map();  // event id -> {row, cells, img, shot}
const SVG = "http://www.w3.org/2000/svg";
const ZONE_COLOUR = "#00e5ff", LINE_COLOUR = "#ffea00", IN_COLOUR = "#76ff03";

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

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  if (text !== undefined) node.textContent = String(text);
  return node;
}
function finite(v) { return typeof v === "number" && isFinite(v); }
function point(p) {  // [x, y] in fractions of the frame, or null
  return Array.isArray(p) && p.length === 2 && finite(p[0]) && finite(p[1]) ? p : null;
}
function tally(counts) {  // {label: n} -> "person 2, car 1"
  if (!counts || typeof counts !== "object") return "";
  return Object.entries(counts).filter(([, n]) => finite(n)).map(([label, n]) => label + " " + n).join(", ");
}
function total(counts) {
  return counts && typeof counts === "object" ? Object.values(counts).filter(finite).reduce((a, b) => a + b, 0) : 0;
}

// The overlay: zones and lines in the frame's own pixels (its view box), laid over the image.
function drawOverlay(card) {
  const {img, overlay, cam} = card;
  const w = img.naturalWidth, h = img.naturalHeight;
  const zones = Array.isArray(cam && cam.zones) ? cam.zones : [];
  const lines = Array.isArray(cam && cam.lines) ? cam.lines : [];
  if (!w || !h || img.classList.contains("hidden") || (zones.length === 0 && lines.length === 0)) {
    overlay.classList.add("hidden");
    return;
  }
  overlay.setAttribute("viewBox", "0 0 " + w + " " + h);
  overlay.style.left = img.offsetLeft + "px";
  overlay.style.top = img.offsetTop + "px";
  overlay.style.width = img.offsetWidth + "px";
  overlay.style.height = img.offsetHeight + "px";
  const font = Math.max(10, Math.round(Math.min(w, h) / 28));
  const parts = [];
  for (const zone of zones) {
    const pts = (Array.isArray(zone.polygon) ? zone.polygon : []).map(point);
    if (pts.length < 3 || pts.includes(null)) continue;
    const g = svg("g", {"class": "zone"});
    g.dataset.name = String(zone.name);
    g.appendChild(svg("polygon", {points: pts.map((p) => p[0] * w + "," + p[1] * h).join(" "),
                                  fill: ZONE_COLOUR, "fill-opacity": 0.15, stroke: ZONE_COLOUR,
                                  "stroke-width": 2, "vector-effect": "non-scaling-stroke"}));
    const top = pts.reduce((a, b) => (b[1] < a[1] ? b : a));
    g.appendChild(svg("text", {x: top[0] * w + 4, y: top[1] * h + font + 2, fill: ZONE_COLOUR, "font-size": font},
                      zone.name + ": " + total(zone.objects)));
    parts.push(g);
  }
  for (const line of lines) {
    const ends = (Array.isArray(line.points) ? line.points : []).map(point);
    if (ends.length !== 2 || ends.includes(null)) continue;
    const [ax, ay, bx, by] = [ends[0][0] * w, ends[0][1] * h, ends[1][0] * w, ends[1][1] * h];
    const len = Math.hypot(bx - ax, by - ay);
    if (len === 0) continue;
    // `in` goes from cross > 0 to cross < 0, cross = (Bx-Ax)(Py-Ay) - (By-Ay)(Px-Ax): along (dy, -dx)
    const ux = (by - ay) / len, uy = -(bx - ax) / len;
    const mx = (ax + bx) / 2, my = (ay + by) / 2, arrow = Math.min(w, h) / 10, head = arrow / 3;
    const tx = mx + ux * arrow, ty = my + uy * arrow;
    const g = svg("g", {"class": "line"});
    g.dataset.name = String(line.name);
    const stroke = {"stroke-width": 3, "vector-effect": "non-scaling-stroke"};
    g.appendChild(svg("line", {"class": "segment", x1: ax, y1: ay, x2: bx, y2: by, stroke: LINE_COLOUR, ...stroke}));
    g.appendChild(svg("line", {"class": "in-arrow", x1: mx, y1: my, x2: tx, y2: ty, stroke: IN_COLOUR, ...stroke}));
    g.appendChild(svg("polygon", {points: [[tx + ux * head, ty + uy * head], [tx - uy * head, ty + ux * head],
                                           [tx + uy * head, ty - ux * head]].map((p) => p.join(",")).join(" "),
                                  fill: IN_COLOUR}));
    g.appendChild(svg("text", {x: tx + ux * (head + font), y: ty + uy * (head + font) + font / 3, fill: IN_COLOUR,
                               "font-size": font, "text-anchor": "middle"}, "in"));
    for (const [x, y, name] of [[ax, ay, "A"], [bx, by, "B"]]) {  // on the side the arrow leaves
      g.appendChild(svg("text", {"class": "end", x: x - ux * font, y: Math.min(Math.max(y - uy * font, font), h - 2),
                                 fill: LINE_COLOUR, "font-size": font, "text-anchor": "middle"}, name));
    }
    g.appendChild(svg("text", {x: ax + 4, y: Math.min(Math.max(ay, font), h) + font, fill: LINE_COLOUR,
                               "font-size": font}, line.name));
    parts.push(g);
  }
  replaceChildren(overlay, parts);
  overlay.classList.remove("hidden");
}

function showCounts(card, cam) {
  const rows = [];
  for (const zone of Array.isArray(cam.zones) ? cam.zones : []) {
    const row = el("div", "zone-count", "zone " + zone.name + ": " + total(zone.objects) + " inside");
    if (tally(zone.objects)) row.textContent += " (" + tally(zone.objects) + ")";
    row.textContent += " \\u00b7 entered " + (tally(zone.entered) || "none");
    rows.push(row);
  }
  for (const line of Array.isArray(cam.lines) ? cam.lines : []) {
    rows.push(el("div", "line-count", "line " + line.name + ": in " + (tally(line.in) || "none") +
                                      " \\u00b7 out " + (tally(line.out) || "none")));
  }
  replaceChildren(card.counts, rows);
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
  const overlay = svg("svg", {"class": "overlay hidden", preserveAspectRatio: "none"});
  frame.appendChild(img);
  frame.appendChild(overlay);
  frame.appendChild(placeholder);
  root.appendChild(frame);
  const counts = el("div", "counts");
  root.appendChild(counts);
  const card = {root, fields, img, placeholder, shownFor: -1, loading: false, overlay, counts, cam: null};
  img.addEventListener("load", () => {
    card.loading = false;
    img.classList.remove("hidden");
    placeholder.classList.add("hidden");
    drawOverlay(card);
  });
  new ResizeObserver(() => drawOverlay(card)).observe(img);
  img.addEventListener("error", () => {  // 503 between frames of a reload: try again next poll
    card.loading = false;
    card.shownFor = -1;
    img.classList.add("hidden");
    placeholder.classList.remove("hidden");
    drawOverlay(card);
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
  card.cam = cam;
  showCounts(card, cam);
  drawOverlay(card);
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

function clock(t) {  // Unix seconds -> local time of day
  return finite(t) ? new Date(t * 1000).toLocaleTimeString() : "\\u2013";
}

function eventRow(id) {
  const row = el("tr");
  row.dataset.event = id;
  const img = el("img", "thumb hidden");
  img.alt = "best shot of event " + id;
  img.addEventListener("load", () => img.classList.remove("hidden"));
  img.addEventListener("error", () => img.classList.add("hidden"));  // dropped for the budget meanwhile
  const first = el("td");
  first.appendChild(img);
  row.appendChild(first);
  const cells = [];
  for (let i = 0; i < 8; i++) { const cell = el("td"); cells.push(cell); row.appendChild(cell); }
  return {row, cells, img, shot: null};
}

function showEvents(events) {
  const body = document.getElementById("events");
  document.getElementById("events-note").classList.toggle("hidden", events.length > 0);
  const rows = [];
  const seen = new Set();
  for (const e of events) {
    const id = String(e.id);
    if (seen.has(id)) continue;
    seen.add(id);
    let entry = eventRows.get(id);
    if (!entry) { entry = eventRow(id); eventRows.set(id, entry); }
    const last = finite(e.end_time) ? e.end_time : e.frame_time;
    const crossings = (Array.isArray(e.crossings) ? e.crossings : []).map((c) => c.line + " " + c.direction);
    const texts = [e.camera, id, e.label, e.type === "end" ? "ended" : "active", clock(e.start_time),
                   finite(last) && finite(e.start_time) ? num(last - e.start_time, 0, " s") : "\\u2013",
                   (Array.isArray(e.entered_zones) ? e.entered_zones : []).join(", "), crossings.join(", ")];
    texts.forEach((text, i) => { entry.cells[i].textContent = String(text ?? ""); });
    const shot = e.jpeg && finite(e.jpeg.frame_time) ? String(e.jpeg.frame_time) : null;
    if (shot !== entry.shot) {  // a new best shot: ask for it again, else keep the one shown
      entry.shot = shot;
      if (shot === null) { entry.img.removeAttribute("src"); entry.img.classList.add("hidden"); }
      else entry.img.src = "/api/events/" + encodeURIComponent(id) + "/snapshot.jpg?v=" + encodeURIComponent(shot);
    }
    rows.push(entry.row);
  }
  for (const id of [...eventRows.keys()]) if (!seen.has(id)) eventRows.delete(id);
  replaceChildren(body, rows);
}

async function pollEvents() {
  const note = document.getElementById("events-note");
  try {
    const reply = await fetch("/api/events?limit=20", {cache: "no-store"});
    if (!reply.ok) throw new Error("HTTP " + reply.status);
    const data = await reply.json();
    showEvents(Array.isArray(data.events) ? data.events : []);
  } catch (err) {
    note.textContent = "cannot read the recent events (" + err.message + ")";
    note.classList.remove("hidden");
  }
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
    await pollEvents();
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

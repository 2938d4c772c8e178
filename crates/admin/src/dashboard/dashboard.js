// holdfast's dashboard: reads /status once a second (the browser's login cookie) and draws
// it. Everything from the server is put into the page as text, never as markup.
"use strict";

const POLL_MS = 1000;
const KEEP = 300; // samples: five minutes at one a second
const SHOWN = 200; // sessions in the table at most (the finder narrows them on the server)
const samples = [];
const events = [];
let previous = null;
// From /metrics, every few polls: errors sent to clients by code, sessions holdfast closed
// by reason (totals since holdfast started).
const troubles = { errors: new Map(), closed: new Map(), total: null, at: 0, rate: null, polls: 0 };
const METRICS_EVERY = 5;
let failures = 0;

const CHARTS = [
  { key: "commands", title: "commands/s", rate: true, pick: s => s.counters.commands },
  { key: "sessions", title: "sessions open", pick: s => s.counters.sessions_open },
  { key: "moved", title: "sessions moved/s", rate: true, pick: s => s.counters.sessions_moved },
  { key: "held", title: "requests held/s", rate: true, pick: s => s.counters.requests_held },
  { key: "blocked", title: "sessions that cannot move", pick: s => s.sessions.filter(x => !x.movable).length },
  { key: "move_ms", title: "mean move ms", pick: s => s.counters.mean_move_ms },
  { key: "errors", title: "errors sent/s", pick: () => troubles.rate },
  { key: "ccu", title: "size (CCU)", pick: s => s.serverless ? s.serverless.ccu : null, only: s => !!s.serverless },
  { key: "resume_ms", title: "last resume ms", pick: s => s.serverless ? s.serverless.last_resume_ms : null, only: s => !!s.serverless },
];

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c ?? "")));
  return e;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

function ago(secs) {
  if (secs < 60) return secs + " s";
  if (secs < 3600) return Math.floor(secs / 60) + " min";
  return Math.floor(secs / 3600) + " h " + Math.floor((secs % 3600) / 60) + " min";
}

// The server's event log (the last hundred HA and serverless events), newest first.
function showEvents(s) {
  const list = document.getElementById("events");
  const all = s.events || [];
  const newest = all.length ? all[all.length - 1].unix_ms + ":" + all.length : "";
  if (list.dataset.newest === newest) return;
  list.dataset.newest = newest;
  events.length = 0;
  for (const e of all) events.push({ at: e.unix_ms, text: e.text, failed: !!e.bad });
  list.replaceChildren(...all.slice().reverse().map(e =>
    el("li", e.bad ? { class: "failed", "data-kind": e.kind } : { "data-kind": e.kind },
      el("time", {}, clock(e.unix_ms)), e.text)));
  if (!all.length) list.replaceChildren(el("li", { class: "none" }, "nothing has happened since holdfast started"));
}

function header(s) {
  document.getElementById("primary").textContent = s.topology.primary || "none";
  const about = document.getElementById("about");
  about.textContent = `${s.version} · up ${ago(s.uptime_secs)} · ${s.listen} · pid ${s.pid}`;
  const fleet = document.getElementById("fleet");
  fleet.hidden = !s.fleet;
  if (s.fleet) {
    fleet.textContent = s.fleet.leader
      ? `fleet ${s.fleet.name}: ${s.fleet.member} leads`
      : `fleet ${s.fleet.name}: ${s.fleet.leader_member || "no member"} leads`;
  }
  const phase = document.getElementById("serverless-phase");
  phase.hidden = !s.serverless;
  if (s.serverless) phase.textContent = `instance ${s.serverless.phase}, ${s.serverless.ccu} CCU`;
  const op = document.getElementById("operation");
  op.hidden = !s.ha.in_progress;
  if (s.ha.in_progress) op.textContent = `${s.ha.in_progress.operation} running`;
}

function nodes(s) {
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren(...s.topology.nodes.map(n => {
    const role = n.name === s.topology.primary ? "primary" : (n.replication ? "replica" : (n.read_only ? "read-only" : "—"));
    const lag = n.replication && n.replication.lag_ms != null ? (n.replication.lag_ms / 1000) + " s" : "—";
    const notes = [];
    if (n.draining) notes.push("draining");
    if (n.deposed) notes.push("deposed");
    if (n.replication && (!n.replication.io_running || !n.replication.sql_running)) notes.push("replication stopped");
    if (n.replication && n.replication.error) notes.push(n.replication.error);
    if (n.last_error && !n.reachable) notes.push(n.last_error);
    if ((s.ha.needs_rejoin || []).includes(n.name)) notes.push("needs rejoin");
    return el("tr", { "data-node": n.name },
      el("td", {}, n.name),
      el("td", { class: role === "primary" ? "yes" : "" }, role),
      el("td", { class: n.reachable ? "yes" : "no" }, n.reachable ? "yes" : "no"),
      el("td", {}, lag),
      el("td", {}, n.serves_reads ? "yes" : "no"),
      el("td", {}, n.active_requests),
      el("td", { class: notes.length ? "warn" : "" }, notes.join("; ")));
  }));
}

function finding() {
  return document.getElementById("find").value.trim().toLowerCase();
}

function move(m) {
  return `${clock(m.unix_ms)} ${m.from || "?"} → ${m.to} (${m.why}, ${Math.round(m.ms * 10) / 10} ms)`;
}

// The sessions the server sent (the first SHOWN that match the finder), filtered again
// here so typing answers at once.
function sessions(s) {
  const find = finding();
  const rows = s.sessions.filter(x => !find || [x.id, x.user, x.client, x.backend, x.blocked_by || "", x.statement || ""]
    .some(v => String(v).toLowerCase().includes(find)));
  const total = s.counters.sessions_open;
  document.getElementById("session-count").textContent =
    rows.length < total ? `(${rows.length} shown of ${total})` : `(${total})`;
  const body = document.querySelector("#sessions tbody");
  body.replaceChildren(...rows.map(x => {
    const journey = x.journey || [];
    const last = journey.length ? move(journey[journey.length - 1]) : "";
    return el("tr", { "data-session": x.id, title: journey.map(move).join("\n") },
      el("td", {}, x.id), el("td", {}, x.user), el("td", {}, x.client), el("td", {}, x.backend),
      el("td", {}, ago(x.age_secs)), el("td", {}, x.commands), el("td", {}, x.moves),
      el("td", { class: x.movable ? "yes" : "warn" }, x.movable ? "movable" : (x.blocked_by || "not movable")),
      el("td", { class: "journey" }, last),
      now(x),
      el("td", {}, endButton(x.id)));
  }));
}

// Ending a session takes two clicks within 4 s and the admin token typed into the page
// (the login cookie reads only). The token is sent with the request and kept nowhere.
let armed = null; // { id, until }

function endButton(id) {
  const sure = armed && armed.id === id && Date.now() < armed.until;
  const b = el("button", { type: "button", "data-end": id, class: sure ? "armed" : "" }, sure ? "sure?" : "end");
  b.addEventListener("click", () => endSession(id));
  return b;
}

async function endSession(id) {
  const result = document.getElementById("action-result");
  const token = document.getElementById("token").value.trim();
  if (!token) {
    document.getElementById("actions").open = true;
    result.textContent = "type the admin token to end a session";
    return;
  }
  if (!(armed && armed.id === id && Date.now() < armed.until)) {
    armed = { id, until: Date.now() + 4000 };
    if (previous) sessions(previous);
    return;
  }
  armed = null;
  try {
    const r = await fetch(`/sessions/kill?id=${encodeURIComponent(id)}`,
      { method: "POST", headers: { Authorization: `Bearer ${token}` }, cache: "no-store" });
    const body = await r.json().catch(() => ({}));
    result.textContent = r.ok
      ? `session ${body.session} ended (KILL of thread ${body.thread} on ${body.node})`
      : `session ${id} not ended: ${body.error || r.status}`;
  } catch (e) {
    result.textContent = `session ${id} not ended: ${e}`;
  }
  if (previous) sessions(previous);
}

// What a session is doing: idle, held (a switchover runs), running; a request that has run
// for over half a second shows its statement and for how long.
function now(x) {
  if (!x.statement) return el("td", { class: x.state === "held" ? "warn" : "" }, x.state || "");
  const secs = (x.statement_ms / 1000).toFixed(1);
  return el("td", { class: "statement warn", title: x.statement }, `${x.state} ${secs} s: ${x.statement}`);
}

function charts() {
  const host = document.getElementById("charts");
  const last = samples[samples.length - 1];
  for (const c of CHARTS) {
    let box = document.getElementById("chart-" + c.key);
    const shown = !c.only || c.only(last.status);
    if (!shown) { if (box) box.remove(); continue; }
    if (!box) {
      box = el("div", { class: "chart", id: "chart-" + c.key },
        el("div", { class: "title" }, el("span", {}, c.title), el("span", { class: "now" }, "")));
      box.append(document.createElementNS("http://www.w3.org/2000/svg", "svg"));
      host.append(box);
    }
    const points = [];
    for (let i = 0; i < samples.length; i++) {
      const v = samples[i].values[c.key];
      if (v != null && isFinite(v)) points.push([samples[i].t, v]);
    }
    const now = points.length ? points[points.length - 1][1] : null;
    box.querySelector(".now").textContent = now == null ? "—" : (Math.round(now * 10) / 10).toLocaleString();
    draw(box.querySelector("svg"), points);
  }
}

function draw(svg, points) {
  const W = 300, H = 70, end = Date.now(), start = end - KEEP * POLL_MS;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const max = Math.max(1, ...points.map(p => p[1])) * 1.1;
  const x = t => ((t - start) / (end - start)) * W;
  const y = v => H - (v / max) * (H - 4) - 2;
  const ns = "http://www.w3.org/2000/svg";
  const parts = [];
  for (const e of events) {
    if (e.at < start) continue;
    const line = document.createElementNS(ns, "line");
    line.setAttribute("class", "event");
    line.setAttribute("x1", x(e.at)); line.setAttribute("x2", x(e.at));
    line.setAttribute("y1", 0); line.setAttribute("y2", H);
    parts.push(line);
  }
  const poly = document.createElementNS(ns, "polyline");
  poly.setAttribute("points", points.map(p => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
  parts.push(poly);
  svg.replaceChildren(...parts);
}

function sample(s) {
  const t = Date.now();
  const values = {};
  const prev = samples[samples.length - 1];
  for (const c of CHARTS) {
    const v = c.pick(s);
    if (c.rate) {
      values[c.key] = prev && prev.raw[c.key] != null && v != null
        ? Math.max(0, (v - prev.raw[c.key]) / ((t - prev.t) / 1000)) : null;
    } else {
      values[c.key] = v;
    }
  }
  const raw = {};
  for (const c of CHARTS) raw[c.key] = c.pick(s);
  samples.push({ t, values, raw, status: s });
  if (samples.length > KEEP) samples.shift();
  // Only the newest sample keeps its whole status.
  if (prev) prev.status = null;
}

// The counters of one labelled family in the Prometheus text, by label value.
function family(text, name, label) {
  const out = new Map();
  const re = new RegExp("^" + name + "\\{[^}]*" + label + "=\"([^\"]*)\"[^}]*\\} ([0-9.e+]+)$", "gm");
  for (const m of text.matchAll(re)) out.set(m[1], (out.get(m[1]) || 0) + Number(m[2]));
  return out;
}

async function readTroubles() {
  try {
    const r = await fetch("/metrics", { credentials: "same-origin", cache: "no-store" });
    if (!r.ok) return;
    const text = await r.text();
    troubles.errors = family(text, "holdfast_errors_total", "code");
    troubles.closed = family(text, "holdfast_sessions_closed_by_holdfast_total", "reason");
    // The rate over the time since the last read (every few seconds).
    const total = [...troubles.errors.values()].reduce((a, b) => a + b, 0);
    const now = Date.now();
    if (troubles.total != null && now > troubles.at) {
      troubles.rate = Math.max(0, (total - troubles.total) / ((now - troubles.at) / 1000));
    }
    troubles.total = total;
    troubles.at = now;
    showTroubles();
  } catch (e) {
    // The next poll says whether holdfast answers.
  }
}

function showTroubles() {
  const list = (map, none) => {
    const rows = [...map.entries()].filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
    return rows.length ? rows.map(([k, n]) => el("li", {}, `${k}: ${n}`)) : [el("li", { class: "none" }, none)];
  };
  document.getElementById("errors").replaceChildren(...list(troubles.errors, "none"));
  document.getElementById("closed").replaceChildren(...list(troubles.closed, "none"));
}

async function poll() {
  const live = document.getElementById("live");
  try {
    const query = `?sessions_max=${SHOWN}&find=${encodeURIComponent(finding())}`;
    const r = await fetch("/status" + query, { credentials: "same-origin", cache: "no-store" });
    if (r.status === 401) {
      live.textContent = "logged out: run `holdfast ctl dashboard` for a new link";
      live.classList.add("stale");
      return;
    }
    if (!r.ok) throw new Error("HTTP " + r.status);
    const s = await r.json();
    if (troubles.polls++ % METRICS_EVERY === 0) await readTroubles();
    previous = s;
    failures = 0;
    sample(s);
    header(s);
    showEvents(s);
    nodes(s);
    sessions(s);
    charts();
    live.textContent = "live · " + clock(Date.now());
    live.classList.remove("stale");
  } catch (e) {
    failures += 1;
    live.textContent = `no answer from holdfast (${failures}): ${e.message}`;
    live.classList.add("stale");
  } finally {
    setTimeout(poll, POLL_MS);
  }
}

document.getElementById("find").addEventListener("input", () => { if (previous) sessions(previous); });
poll();

// disque-mp dashboard: one static page over the node's JSON API (/api/...).
// No build step, no dependency: every asset comes from the node itself.
"use strict";

const PERIOD_MS = 2000;      // live refresh of the current view
const CHART_POINTS = 90;     // rate history kept for the chart (3 minutes at 2 s)
const DEAD = "dead:";        // dead-letter queue of q is dead:q

const state = { route: "", timer: null, history: [], filter: "", busy: false, sampled: false, seq: 0 };

// ------------------------------------------------------------------ helpers

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  // flat to any depth: a view passes lists of [dt, dd] pairs as well as nodes
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path, method, body) {
  const opts = { method: method || "GET", headers: {} };
  if (method && method !== "GET" && method !== "DELETE") {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body || {});
  }
  const resp = await fetch(path, opts);
  let data = null;
  try { data = await resp.json(); } catch (e) { data = { error: resp.statusText }; }
  if (!resp.ok) throw new Error((data && data.error) || resp.statusText);
  return data;
}

const enc = encodeURIComponent;
const fmt = (n) => (n === null || n === undefined) ? "–" : Number(n).toLocaleString("en-US");
const rate = (n) => n ? n.toFixed(1) : "0";

function age(s) {
  if (s === null || s === undefined) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function bytes(n) {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function flash(text, isError) {
  const box = document.getElementById("flash");
  box.replaceChildren(el("div", { class: "msg" + (isError ? " error" : ""), text }));
  clearTimeout(flash.t);
  flash.t = setTimeout(() => box.replaceChildren(), 6000);
}

async function act(label, fn) {
  if (state.busy) return;
  state.busy = true;
  try { flash(await fn()); } catch (e) { flash(label + ": " + e.message, true); }
  finally { state.busy = false; refresh(); }
}

function badge(text, kind) { return el("span", { class: "badge " + (kind || text) }, text); }

// ------------------------------------------------------------------ overview and chart

async function renderOverview() {
  const o = await api("/api/overview");
  document.getElementById("node-id").textContent = o.node_id.slice(0, 8) + " · port " + o.port + " · " + o.workers + " workers";
  const stat = (label, value) => el("div", { class: "stat" }, el("b", {}, value), el("span", {}, label));
  document.getElementById("overview").replaceChildren(
    stat("queued", fmt(o.queued)), stat("active", fmt(o.active)), stat("delayed", fmt(o.delayed)),
    stat("queues", fmt(o.queues)), stat("clients", fmt(o.clients)), stat("ops/s", fmt(o.ops_per_sec)),
    stat("memory", bytes(o.memory_used) + (o.memory_level ? " (level " + o.memory_level + ")" : "")),
    stat("uptime", age(o.uptime_s)));
  return o;
}

function drawChart(canvas) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width = canvas.clientWidth * devicePixelRatio;
  const h = canvas.height = canvas.clientHeight * devicePixelRatio;
  ctx.clearRect(0, 0, w, h);
  const pts = state.history;
  const top = Math.max(1, ...pts.map(p => Math.max(p.in, p.out)));
  ctx.strokeStyle = "#e3e6ec"; ctx.lineWidth = 1;
  ctx.fillStyle = "#667085"; ctx.font = (11 * devicePixelRatio) + "px system-ui";
  for (let i = 0; i <= 4; i++) {
    const y = h - (h - 14 * devicePixelRatio) * i / 4 - 1;
    ctx.beginPath(); ctx.moveTo(0, y); ctx.lineTo(w, y); ctx.stroke();
    ctx.fillText(rate(top * i / 4) + "/s", 4, y - 3);
  }
  const line = (key, color) => {
    if (pts.length < 2) return;
    ctx.strokeStyle = color; ctx.lineWidth = 2 * devicePixelRatio; ctx.beginPath();
    pts.forEach((p, i) => {
      const x = w * i / (pts.length - 1);  // the history fills the width as it grows
      const y = h - (h - 14 * devicePixelRatio) * p[key] / top - 1;
      i ? ctx.lineTo(x, y) : ctx.moveTo(x, y);
    });
    ctx.stroke();
  };
  line("in", "#2b5fd9"); line("out", "#12a150");
}

// ------------------------------------------------------------------ views

function pauseButton(q) {
  const paused = q.pause !== "none";
  return el("button", {
    "data-action": paused ? "resume" : "pause", "data-queue": q.name,
    "aria-label": (paused ? "Resume " : "Pause ") + q.name,
    onclick: () => act(paused ? "resume" : "pause", async () => {
      const r = await api("/api/queues/" + enc(q.name) + (paused ? "/resume" : "/pause"), "POST", {});
      return "Queue " + r.queue + " is now " + (r.pause === "none" ? "running" : "paused (" + r.pause + ")");
    }),
  }, paused ? "Resume" : "Pause");
}

async function viewQueues(main) {
  const data = await api("/api/queues?limit=500");
  const live = data.queues.filter(q => !q.name.startsWith(DEAD));
  // rates need two samples on the server: the first answer after a load has none
  if (state.sampled) state.history.push({ in: live.reduce((a, q) => a + q.in_rate, 0), out: live.reduce((a, q) => a + q.out_rate, 0) });
  state.sampled = true;
  if (state.history.length > CHART_POINTS) state.history.shift();
  const canvas = el("canvas", { role: "img", "aria-label": "Jobs in and out per second, all queues" });
  const filter = el("input", { type: "search", id: "filter", placeholder: "Filter queues  (/)", value: state.filter,
    "aria-label": "Filter queues by name",
    oninput: (e) => { state.filter = e.target.value; fill(); } });
  const body = el("tbody");
  const fill = () => {
    const rows = live.filter(q => q.name.includes(state.filter)).map(q => el("tr", { "data-queue": q.name },
      el("td", {}, el("a", { href: "#/queue/" + enc(q.name), class: "mono" }, q.name)),
      el("td", { class: "num" }, fmt(q.queued)), el("td", { class: "num" }, fmt(q.active)),
      el("td", { class: "num" }, fmt(q.delayed)), el("td", { class: "num" }, age(q.oldest_age_s)),
      el("td", { class: "num" }, rate(q.in_rate)), el("td", { class: "num" }, rate(q.out_rate)),
      el("td", { class: "num" }, fmt(q.blocked)),
      el("td", { "data-pause": q.pause }, q.pause === "none" ? "" : badge("paused " + q.pause, "paused")),
      el("td", {}, pauseButton(q))));
    body.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: 10, class: "empty" }, "No queues"))]));
  };
  fill();
  main.replaceChildren(
    el("div", { class: "card" }, el("h1", {}, "Throughput"),
      el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:#2b5fd9" }), "in (jobs/s)"),
        el("span", {}, el("i", { style: "background:#12a150" }), "out (jobs/s)")), canvas),
    el("div", { class: "card" },
      el("div", { class: "toolbar" }, el("h1", { style: "margin:0" }, "Queues"), filter,
        el("span", { class: "muted" }, live.length + " shown of " + fmt(data.total) + " (largest first)")),
      el("table", { id: "queues" },
        el("thead", {}, el("tr", {}, ["Queue", "Queued", "Active", "Delayed", "Oldest", "In/s", "Out/s", "Blocked", "State", ""]
          .map((h, i) => el("th", { class: i && i < 8 ? "num" : null, scope: "col" }, h)))),
        body)));
  drawChart(canvas);
  if (state.refocus) { filter.focus(); filter.setSelectionRange(filter.value.length, filter.value.length); }
}

function jobActions(job) {
  const id = job.id;
  const path = "/api/jobs/" + enc(id);
  const b = (action, label, fn, cls) => el("button", { "data-action": action, "data-job": id, class: cls || null,
    "aria-label": label + " " + id, onclick: () => act(label, fn) }, label);
  return el("div", { class: "actions" },
    el("a", { href: "#/job/" + enc(id), "data-action": "open", "data-job": id }, "Open"),
    b("ack", "ACK", async () => { await api(path + "/ack", "POST"); return "Acknowledged " + id; }),
    job.state === "active" ? b("nack", "NACK", async () => { await api(path + "/nack", "POST"); return "Requeued " + id + " (NACK)"; }) : null,
    String(job.queue || "").startsWith(DEAD) ? null :
      b("dead", "Dead-letter", async () => { const r = await api(path + "/dead", "POST"); return "Moved to " + r.moved_to; }),
    b("delete", "Delete", async () => { await api(path, "DELETE"); return "Deleted " + id; }, "danger"));
}

function jobTable(jobs, empty) {
  if (!jobs.length) return el("p", { class: "empty" }, empty);
  return el("table", {},
    el("thead", {}, el("tr", {}, ["Job", "State", "Body", "NACKs", "Redeliveries", "Max deliveries", "Actions"]
      .map(h => el("th", { scope: "col" }, h)))),
    el("tbody", {}, jobs.map(j => el("tr", { "data-job": j.id },
      el("td", { class: "mono" }, j.id), el("td", {}, badge(j.state)),
      el("td", { class: "mono" }, String(j.body).slice(0, 120)),
      el("td", { class: "num", "data-field": "nacks" }, fmt(j.nacks)),
      el("td", { class: "num", "data-field": "additional-deliveries" }, fmt(j["additional-deliveries"])),
      el("td", { class: "num", "data-field": "maxdeliver" }, fmt(j.maxdeliver)),
      el("td", {}, jobActions(j))))));
}

async function viewQueue(main, name) {
  const data = await api("/api/queues/" + enc(name));
  const q = data.queue;
  data.jobs.forEach(j => { j.queue = q.name; });
  const isDead = q.name.startsWith(DEAD);
  const fields = [["length", fmt(q.len)], ["jobs in", fmt(q["jobs-in"])], ["jobs out", fmt(q["jobs-out"])],
    ["blocked clients", fmt(q.blocked)], ["age", age(q.age)], ["idle", age(q.idle)],
    ["import rate", fmt(q["import-rate"])], ["pause", q.pause],
    ["active (delivered, not acked)", fmt(q.active)], ["delayed", fmt(q.delayed)],
    ["oldest queued job", q.len ? age(q["oldest-age"]) : "–"],
    ["dead letters", isDead || !q["dead-len"] ? fmt(isDead ? null : q["dead-len"])
      : el("a", { href: "#/queue/" + enc(DEAD + q.name) }, fmt(q["dead-len"]))]];
  main.replaceChildren(
    el("div", { class: "card" },
      el("div", { class: "toolbar" }, el("h1", { style: "margin:0" }, "Queue ", el("span", { class: "mono" }, q.name)),
        q.pause !== "none" ? badge("paused " + q.pause, "paused") : null,
        pauseButton({ name: q.name, pause: q.pause }),
        isDead ? requeueButton(q.name) : null),
      el("dl", { class: "fields" }, fields.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]))),
    el("div", { class: "card" }, el("h2", {}, "Queued jobs (oldest first)"), jobTable(data.jobs, "No queued job")),
    el("div", { class: "card" }, el("h2", {}, "Active jobs (delivered, not acknowledged)"),
      jobTable(data.active, "No active job"),
      data.active_scan_complete ? null : el("p", { class: "muted" }, "Scan stopped early: more active jobs may exist.")));
}

async function viewJob(main, id) {
  const job = await api("/api/jobs/" + enc(id));
  const keys = ["queue", "state", "repl", "ttl", "ctime", "delay", "retry", "nacks", "additional-deliveries",
    "nodes-delivered", "nodes-confirmed", "next-requeue-within", "next-awake-within"]
    .concat(job.maxdeliver === undefined ? [] : ["maxdeliver"]);
  main.replaceChildren(el("div", { class: "card", id: "job" },
    el("div", { class: "toolbar" }, el("h1", { style: "margin:0" }, "Job ", el("span", { class: "mono" }, job.id)),
      el("span", { id: "job-state" }, badge(job.state))),
    el("dl", { class: "fields" }, keys.map(k => [el("dt", {}, k), el("dd", { "data-field": k, class: k.startsWith("nodes") ? "mono" : null },
      k === "queue" ? el("a", { href: "#/queue/" + enc(job.queue), class: "mono" }, job.queue) :
      Array.isArray(job[k]) ? job[k].join(", ") || "–" : String(job[k]))])),
    el("h2", { style: "margin-top:12px" }, "Body"), el("pre", { class: "body mono" }, job.body),
    jobActions(job)));
}

function requeueButton(name) {
  return el("button", { class: "primary", "data-action": "requeue", "data-queue": name, "aria-label": "Requeue every job of " + name,
    onclick: () => act("requeue", async () => {
      const r = await api("/api/queues/" + enc(name) + "/requeue", "POST");
      return "Requeued " + r.requeued + " jobs from " + r.from + " to " + r.to + (r.left ? " (" + r.left + " left)" : "");
    }) }, "Requeue all");
}

async function viewDead(main) {
  const data = await api("/api/queues?limit=500");
  const dead = data.queues.filter(q => q.name.startsWith(DEAD));
  main.replaceChildren(el("div", { class: "card" },
    el("h1", {}, "Dead-letter queues"),
    el("p", { class: "muted" }, "A job moved with “Dead-letter” goes to dead:<queue>, and so does a job added with MAXDELIVER n once it was delivered n times without an ACK (same ID, its counters kept: open the queue to see them); “Requeue all” adds every job back to <queue> with its TTL left, RETRY and MAXDELIVER."),
    dead.length ? el("table", { id: "dead" },
      el("thead", {}, el("tr", {}, ["Queue", "Jobs", "Oldest", "Back to", ""].map(h => el("th", { scope: "col" }, h)))),
      el("tbody", {}, dead.map(q => el("tr", { "data-queue": q.name },
        el("td", {}, el("a", { href: "#/queue/" + enc(q.name), class: "mono" }, q.name)),
        el("td", { class: "num" }, fmt(q.queued)), el("td", {}, age(q.oldest_age_s)),
        el("td", { class: "mono" }, q.name.slice(DEAD.length)), el("td", {}, requeueButton(q.name))))))
      : el("p", { class: "empty" }, "No dead-letter queue")));
}

async function viewNodes(main) {
  const data = await api("/api/nodes");
  main.replaceChildren(el("div", { class: "card" }, el("h1", {}, "Cluster nodes"),
    el("table", { id: "nodes" },
      el("thead", {}, el("tr", {}, ["Node", "Address", "Flags", "Link", "Priority"].map(h => el("th", { scope: "col" }, h)))),
      el("tbody", {}, data.nodes.map(n => el("tr", {},
        el("td", { class: "mono" }, n.id, n.myself ? " (this node)" : ""),
        el("td", { class: "mono" }, (n.ip || "–") + ":" + n.port),
        el("td", {}, n.flags.map(f => badge(f, /fail/.test(f) ? "fail" : ""))),
        el("td", {}, n.link ? badge("connected", "queued") : badge("disconnected", "fail")),
        el("td", { class: "num" }, fmt(n.priority))))))));
}

// ------------------------------------------------------------------ routing and refresh

function parseRoute() {
  const hash = location.hash.replace(/^#/, "") || "/";
  const [, view, arg] = hash.match(/^\/([a-z]*)\/?(.*)$/) || [null, "", ""];
  return { view: view || "queues", arg: arg ? decodeURIComponent(arg) : "" };
}

async function refresh() {
  clearTimeout(state.timer);
  // Refreshes overlap (a timer's still waiting on the API when the route changes):
  // only the latest may draw, or a late queue list would replace the job just opened.
  const seq = ++state.seq;
  const viewEl = document.getElementById("view");
  const main = { replaceChildren: (...nodes) => { if (seq === state.seq) viewEl.replaceChildren(...nodes); } };
  const { view, arg } = parseRoute();
  document.querySelectorAll("nav a[data-nav]").forEach(a =>
    a.getAttribute("data-nav") === (view === "queue" || view === "job" ? "queues" : view)
      ? a.setAttribute("aria-current", "page") : a.removeAttribute("aria-current"));
  state.refocus = document.activeElement && document.activeElement.id === "filter";
  try {
    await renderOverview();
    if (view === "queue") await viewQueue(main, arg);
    else if (view === "job") await viewJob(main, arg);
    else if (view === "dead") await viewDead(main);
    else if (view === "nodes") await viewNodes(main);
    else if (view === "schedules") await viewSchedules(main);  // schedules.js
    else await viewQueues(main);
    if (seq === state.seq) viewEl.setAttribute("data-loaded", view);
  } catch (e) {
    main.replaceChildren(el("div", { class: "card" }, el("h1", {}, "Error"), el("p", { id: "error" }, e.message)));
  }
  // live views refresh; a job's detail stays put while one reads it
  if (view !== "job" && seq === state.seq) state.timer = setTimeout(refresh, PERIOD_MS);
}

let pendingG = false;
document.addEventListener("keydown", (e) => {
  if (e.target.matches("input, textarea") || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === "/") { const f = document.getElementById("filter"); if (f) { e.preventDefault(); f.focus(); } return; }
  if (pendingG) {
    pendingG = false;
    const to = { q: "#/", d: "#/dead", n: "#/nodes" }[e.key];
    if (to) { location.hash = to; e.preventDefault(); }
    return;
  }
  if (e.key === "g") pendingG = true;
});

window.addEventListener("hashchange", () => { refresh().then(() => document.getElementById("view").focus()); });
document.getElementById("period").textContent = PERIOD_MS / 1000;
refresh();

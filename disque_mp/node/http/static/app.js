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

// A duration in seconds in the largest units that read well: "45 s", "5 min 30 s", "23 h 59 min".
function dur(s) {
  if (s === null || s === undefined || isNaN(s)) return "–";
  s = Math.max(0, Math.round(Number(s)));
  const parts = (big, bigU, small, smallU) => big + " " + bigU + (small ? " " + small + " " + smallU : "");
  if (s < 60) return s + " s";
  if (s < 3600) return parts(Math.floor(s / 60), "min", s % 60, "s");
  if (s < 86400) return parts(Math.floor(s / 3600), "h", Math.floor(s % 3600 / 60), "min");
  return parts(Math.floor(s / 86400), "d", Math.floor(s % 86400 / 3600), "h");
}
const durMs = (ms) => (ms === null || ms === undefined) ? "–" : (ms > 0 && ms < 1000 ? ms + " ms" : dur(ms / 1000));

// SHOW's ctime (nanoseconds since the epoch) as a date in UTC and how long ago.
function when(ctimeNs) {
  const ms = Number(ctimeNs) / 1e6;
  if (!ms) return "–";
  const d = new Date(ms);
  const ago = (Date.now() - ms) / 1000;
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC") +
    (ago >= 0 ? " (" + dur(ago) + " ago)" : "");
}

// SHOW's time fields as a reader wants them (the job page keeps the raw value and its unit in a tooltip)
const TIME_FIELDS = {
  ctime: (v) => when(v),
  ttl: (v) => dur(v) + " left",
  delay: (v) => Number(v) ? dur(v) : "none",
  retry: (v) => Number(v) ? dur(v) : "0 (at most once: never requeued)",
  "next-requeue-within": (v) => Number(v) ? "in " + durMs(v) : "–",
  "next-awake-within": (v) => Number(v) ? "in " + durMs(v) : "–",
};
const FIELD_UNITS = { ctime: "ns since the epoch", ttl: "s", delay: "s", retry: "s",
  "next-requeue-within": "ms", "next-awake-within": "ms" };

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
    stat(o.queues === 1 ? "queue" : "queues", fmt(o.queues)), stat("clients", fmt(o.clients)), stat("ops/s", fmt(o.ops_per_sec)),
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

const plural = (n, one, many) => fmt(n) + " " + (n === 1 ? one : many);

// What the table holds, in numbers that add up to the overview's "queues".
function queueCount(data, live) {
  const dead = data.queues.length - live.length;
  const deadText = dead ? " + " + plural(dead, "dead-letter queue", "dead-letter queues") + " (Dead letters)" : "";
  if (data.queues.length >= data.total) return plural(live.length, "queue", "queues") + deadText;
  return "the " + fmt(data.queues.length) + " largest of " + plural(data.total, "queue", "queues") +
    " (dead-letter queues counted)";
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
        el("span", { class: "muted", id: "queue-count" }, queueCount(data, live))),
      el("table", { id: "queues" },
        el("thead", {}, el("tr", {}, ["Queue", "Queued", "Active", "Delayed", "Oldest", "In/s", "Out/s", "Blocked", "State", ""]
          .map((h, i) => el("th", { class: i && i < 8 ? "num" : null, scope: "col" }, h)))),
        body)));
  drawChart(canvas);
}

function jobActions(job) {
  const id = job.id;
  const path = "/api/jobs/" + enc(id);
  const queue = String(job.queue || "");
  const isDead = queue.startsWith(DEAD);
  const kind = job.state === "active" ? (job.kind || "waiting") : job.state;
  const b = (action, label, fn, cls) => el("button", { "data-action": action, "data-job": id, class: cls || null,
    "aria-label": label + " " + id, onclick: () => act(label, fn) }, label);
  return el("div", { class: "actions" },
    el("a", { href: "#/job/" + enc(id), "data-action": "open", "data-job": id }, "Open"),
    kind === "delayed" || kind === "waiting"
      ? b("enqueue", "Run now", async () => { await api(path + "/enqueue", "POST"); return "Queued " + id + " now (ENQUEUE)"; }, "primary") : null,
    isDead && kind === "queued" ? b("requeue-job", "Requeue", async () => {
      const r = await api("/api/queues/" + enc(queue) + "/requeue", "POST", { id });
      return "Requeued " + id + " to " + r.to; }, "primary") : null,
    b("ack", "ACK", async () => { await api(path + "/ack", "POST"); return "Acknowledged " + id; }),
    kind === "delivered" ? b("nack", "NACK", async () => { await api(path + "/nack", "POST"); return "Requeued " + id + " (NACK)"; }) : null,
    isDead ? null :
      b("dead", "Dead-letter", async () => { const r = await api(path + "/dead", "POST"); return "Moved to " + r.moved_to; }),
    b("delete", "Delete", async () => { await api(path, "DELETE"); return "Deleted " + id; }, "danger"));
}

// Why a job is in dead:<queue>: DEADLETTER's REASON, else MAXDELIVER's move (which sets none).
function deadReason(j) {
  if (j["dead-reason"]) return j["dead-reason"];
  if (j.maxdeliver !== undefined) return "MAXDELIVER " + j.maxdeliver + " reached";
  return "moved without a reason";
}

// One table of jobs; `cols` picks the columns after the ID and body.
const JOB_COLUMNS = {
  created: ["Created", j => j.ctime ? dur((Date.now() - Number(j.ctime) / 1e6) / 1000) + " ago" : "–", "ctime"],
  nacks: ["NACKs", j => fmt(j.nacks), "nacks", "num"],
  redeliveries: ["Redeliveries", j => fmt(j["additional-deliveries"]), "additional-deliveries", "num"],
  maxdeliver: ["Max deliveries", j => fmt(j.maxdeliver), "maxdeliver", "num"],
  requeue: ["Requeued in", j => Number(j["next-requeue-within"]) ? durMs(j["next-requeue-within"]) : "never (RETRY 0)", "next-requeue-within"],
  queues: ["Queued in", j => Number(j["next-requeue-within"]) ? durMs(j["next-requeue-within"]) : "now", "next-requeue-within"],
  kind: ["Waits for", j => j.kind === "delayed" ? "its DELAY" : "a requeue", "kind"],
  reason: ["Reason", j => deadReason(j), "dead-reason"],
};

function jobTable(jobs, empty, cols, id) {
  if (!jobs.length) return el("p", { class: "empty", id }, empty);
  const columns = cols.map(c => JOB_COLUMNS[c]);
  return el("table", { class: "jobs", id },
    el("thead", {}, el("tr", {}, ["Job and actions", "Body", ...columns.map(c => c[0])]
      .map((h, i) => el("th", { scope: "col", class: i > 1 && columns[i - 2][3] ? "num" : null }, h)))),
    // the actions sit under the ID: the table stays within an 800 px window
    el("tbody", {}, jobs.map(j => el("tr", { "data-job": j.id, "data-kind": j.kind || j.state },
      el("td", { class: "id" }, el("div", { class: "mono" }, j.id), jobActions(j)),
      el("td", { class: "mono body", title: String(j.body) }, String(j.body).slice(0, 120)),
      columns.map(c => el("td", { class: c[3] || null, "data-field": c[2] }, c[1](j)))))));
}

function section(title, n, table, extra) {
  return el("div", { class: "card" },
    el("div", { class: "toolbar" }, el("h2", { style: "margin:0" }, title, " ", el("span", { class: "muted" }, "(" + fmt(n) + ")")), extra),
    table);
}

// QLIMIT (per node): what is set, what is in use, a form to change it. A node
// without the limits API answers 404 for the path: the card is left out.
function limitsCard(name, lim) {
  if (!lim) return null;
  const draft = state.limitDraft && state.limitDraft.queue === name ? state.limitDraft : null;
  const value = (key) => draft ? draft[key] : String(lim[key.replace("_", "-")] || "");
  const keep = (key) => (e) => {
    if (!state.limitDraft || state.limitDraft.queue !== name)
      state.limitDraft = { queue: name, active: value("active"), rate: value("rate"), group_active: value("group_active"), bcast: false };
    state.limitDraft[key] = e.target.type === "checkbox" ? e.target.checked : e.target.value;
  };
  const input = (key, label) => el("label", {}, label + " ",
    el("input", { type: "number", min: 0, step: 1, id: "limit-" + key.replace("_", "-"), value: value(key), placeholder: "none", oninput: keep(key) }));
  const none = (n) => Number(n) ? fmt(n) : "none";
  const save = (reset) => act("limits", async () => {
    const body = reset ? { reset: true } : {};
    if (!reset) for (const key of ["active", "rate", "group_active"]) {
      const v = document.getElementById("limit-" + key.replace("_", "-")).value.trim();
      body[key] = v === "" ? 0 : Number(v);
    }
    if (document.getElementById("limit-bcast").checked) body.bcast = true;
    const r = await api("/api/queues/" + enc(name) + "/limits", "POST", body);
    state.limitDraft = null;
    return "Limits of " + name + ": active " + none(r.active) + ", rate " + none(r.rate) + ", group-active " + none(r["group-active"]);
  });
  return el("div", { class: "card", id: "limits" },
    el("h2", {}, "Limits on this node (QLIMIT)"),
    el("p", { class: "muted" }, "Per node: the cluster's cap is each value times the nodes serving the queue. Empty or 0: no limit."),
    el("dl", { class: "fields" },
      [["active (delivered, not done)", none(lim.active) + " · " + fmt(lim["in-use"]) + " in use", "active"],
       ["rate (deliveries/s)", none(lim.rate) + (Number(lim.rate) ? " · " + fmt(lim.tokens) + " tokens left" : ""), "rate"],
       ["group-active (per GROUP)", none(lim["group-active"]) + (Number(lim["group-active"]) ? " · " + fmt(lim["full-groups"]) + " groups full" : ""), "group-active"]]
        .map(([k, v, f]) => [el("dt", {}, k), el("dd", { "data-limit": f }, v)])),
    el("div", { class: "toolbar", style: "margin:10px 0 0" },
      input("active", "Active"), input("rate", "Rate"), input("group_active", "Group-active"),
      el("label", {}, el("input", { type: "checkbox", id: "limit-bcast", checked: draft && draft.bcast ? true : null, onchange: keep("bcast") }), " every node (BCAST)"),
      el("button", { class: "primary", "data-action": "limits-save", onclick: () => save(false) }, "Save limits"),
      el("button", { "data-action": "limits-reset", onclick: () => save(true) }, "Remove limits")));
}

async function viewQueue(main, name) {
  const [data, lim] = await Promise.all([api("/api/queues/" + enc(name)),
    name.startsWith(DEAD) ? null : api("/api/queues/" + enc(name) + "/limits").catch(() => null)]);
  const q = data.queue;
  const isDead = q.name.startsWith(DEAD);
  const deadQ = DEAD + q.name;
  const fields = [["queued", fmt(q.len)],
    ["active (delivered, not acked)", fmt(q.active)], ["delayed (DELAY not over)", fmt(q.delayed)],
    ["dead letters", isDead || !q["dead-len"] ? fmt(isDead ? null : q["dead-len"])
      : el("a", { href: "#/queue/" + enc(deadQ) }, fmt(q["dead-len"]))],
    ["oldest queued job", q.len ? dur(q["oldest-age"]) : "–"],
    ["jobs in", fmt(q["jobs-in"])], ["jobs out", fmt(q["jobs-out"])],
    ["blocked clients", fmt(q.blocked)], ["queue age", dur(q.age)], ["idle", dur(q.idle)],
    ["import rate", fmt(q["import-rate"]) + " jobs/s"], ["pause", q.pause]];
  const scanNote = data.active_scan_complete ? null
    : el("p", { class: "muted" }, "Scan stopped early: more jobs may be active or delayed.");
  const queuedCols = isDead ? ["created", "reason", "nacks", "redeliveries"] : ["created", "nacks", "redeliveries", "maxdeliver"];
  main.replaceChildren(
    el("div", { class: "card" },
      el("div", { class: "toolbar" }, el("h1", { style: "margin:0" }, "Queue ", el("span", { class: "mono" }, q.name)),
        q.pause !== "none" ? badge("paused " + q.pause, "paused") : null,
        pauseButton({ name: q.name, pause: q.pause }),
        isDead ? requeueButton(q.name) : null),
      el("dl", { class: "fields" }, fields.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]))),
    section(isDead ? "Dead letters (oldest first)" : "Queued jobs (oldest first)", q.len,
      jobTable(data.jobs, "No queued job", queuedCols, "queued-jobs")),
    isDead ? null : section("Active jobs (delivered, not acknowledged)", q.active,
      [jobTable(data.active, "No active job", ["requeue", "nacks", "redeliveries"], "active-jobs"), scanNote]),
    isDead ? null : section("Delayed and waiting jobs (not queued here yet)", data.delayed.length,
      [jobTable(data.delayed, "No delayed job", ["kind", "queues", "created"], "delayed-jobs"), scanNote]),
    isDead || !data.dead.length ? null : section("Dead letters in " + deadQ, q["dead-len"],
      jobTable(data.dead, "No dead letter", ["reason", "nacks", "redeliveries"], "dead-jobs"), requeueButton(deadQ)),
    limitsCard(q.name, lim));
}

function jobField(job, k) {
  const v = job[k];
  if (k === "queue") return el("a", { href: "#/queue/" + enc(v), class: "mono" }, v);
  if (k in TIME_FIELDS) return TIME_FIELDS[k](v);
  if (Array.isArray(v)) return v.join(", ") || "–";
  return String(v);
}

const KIND_TEXT = { delivered: "delivered, not acknowledged", delayed: "its DELAY is not over",
  waiting: "not queued here: waits for a requeue" };

async function viewJob(main, id) {
  const job = await api("/api/jobs/" + enc(id));
  const keys = ["queue", "state", "repl", "ctime", "ttl", "delay", "retry", "nacks", "additional-deliveries",
    "nodes-delivered", "nodes-confirmed", "next-requeue-within", "next-awake-within"]
    .concat(job.maxdeliver === undefined ? [] : ["maxdeliver"])
    .concat(job["dead-reason"] === undefined ? [] : ["dead-reason"])
    .concat(job.progress === undefined ? [] : ["progress"]);  // WORKING ... PROGRESS
  const label = { ctime: "created", "next-requeue-within": "next requeue", "next-awake-within": "next awake" };
  main.replaceChildren(el("div", { class: "card", id: "job" },
    el("div", { class: "toolbar" }, el("h1", { style: "margin:0" }, "Job ", el("span", { class: "mono" }, job.id)),
      el("span", { id: "job-state" }, badge(job.state), job.kind ? [" ", badge(job.kind), " ", KIND_TEXT[job.kind]] : null)),
    el("dl", { class: "fields" }, keys.map(k => [el("dt", {}, label[k] || k),
      el("dd", { "data-field": k, "data-raw": String(job[k]), title: FIELD_UNITS[k] ? job[k] + " " + FIELD_UNITS[k] : null,
        class: k.startsWith("nodes") ? "mono" : null }, jobField(job, k))])),
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
    el("p", { class: "muted" }, "A job moved with “Dead-letter” goes to dead:<queue>, and so does a job added with MAXDELIVER n once it was delivered n times without an ACK (same ID, its counters kept: open the queue to see them); “Requeue all” adds every job back to <queue> with its TTL left, RETRY and MAXDELIVER; open a queue to requeue one job and read why each job is there."),
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
  const focused = document.activeElement && document.activeElement.closest("#view") ? document.activeElement.id : "";
  const routeKey = view + "/" + arg;
  if (state.shown !== routeKey) {  // a new view: say it loads rather than show the last one
    viewEl.replaceChildren(loadingCard());
    viewEl.setAttribute("aria-busy", "true");
  }
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
  if (seq === state.seq) { state.shown = routeKey; viewEl.removeAttribute("aria-busy"); refocus(focused); }
  // live views refresh; a job's detail stays put while one reads it
  if (view !== "job" && seq === state.seq) state.timer = setTimeout(refresh, PERIOD_MS);
}

// A live view redraws every 2 s: the field one was typing in keeps its focus and caret.
function refocus(id) {
  const e = id && document.getElementById(id);
  if (!e || e === document.activeElement) return;
  e.focus();
  if (e.setSelectionRange && /^(text|search)$/.test(e.type)) e.setSelectionRange(e.value.length, e.value.length);
}

function loadingCard() {
  return el("div", { class: "card loading", id: "loading" }, el("p", {}, "Loading…"));
}

// Search by job ID: a well-formed ID opens its page (which says when the node does not know it).
const JOB_ID = /^D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}$/;
document.getElementById("job-search").addEventListener("submit", (e) => {
  e.preventDefault();
  const input = document.getElementById("job-id");
  const id = input.value.trim();
  if (!JOB_ID.test(id)) { flash("Not a job ID: one looks like D-1a2b3c4d-<24 characters>-05a1", true); return; }
  input.value = "";
  location.hash = "#/job/" + enc(id);
});

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

// disque-mp dashboard: the Schedules view (#/schedules) over GET /api/schedules.
// Loaded before app.js, whose helpers (el, api, fmt, badge) it calls when drawn.
"use strict";

function scheduleTime(ms) {
  if (!ms) return "–";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

async function viewSchedules(main) {
  const data = await api("/api/schedules");
  main.replaceChildren(el("div", { class: "card" },
    el("h1", {}, "Schedules"),
    el("p", { class: "muted" }, "Every node knows these SCHEDULEs; one node fires each time (“firer”: this node, now). A firing is the ADDJOB shown, keyed by its fire time."),
    data.schedules.length ? el("table", { id: "schedules" },
      el("thead", {}, el("tr", {}, ["Name", "Rule", "Queue", "Next fire", "Last fire", "Last job", "Fired", "Skipped", "Firer"].map(h => el("th", { scope: "col" }, h)))),
      el("tbody", {}, data.schedules.map(s => el("tr", { "data-schedule": s.name },
        el("td", { class: "mono" }, s.name),
        el("td", { class: "mono" }, s.rule),
        el("td", {}, el("a", { href: "#/queue/" + encodeURIComponent(s.addjob[0]), class: "mono" }, s.addjob[0])),
        el("td", {}, scheduleTime(s["next-fire"])), el("td", {}, scheduleTime(s["last-fire"])),
        el("td", { class: "mono" }, s["last-job-id"] ? el("a", { href: "#/job/" + encodeURIComponent(s["last-job-id"]) }, s["last-job-id"]) : "–"),
        el("td", { class: "num" }, fmt(s.fired)), el("td", { class: "num" }, fmt(s.skipped)),
        el("td", {}, s.firer === "yes" ? badge("yes", "queued") : "no"),
      ))))
      : el("p", { class: "empty" }, "No schedule (SCHEDULE SET adds one)")));
}

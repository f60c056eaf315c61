"""Plots and the markdown summary from the macro run's pytest-benchmark JSON.

    python -m bench.plots bench/results/macro.json   # re-draw without re-running
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.figures import pyplot, save_figure

RESULTS = Path(__file__).resolve().parent / "results"

# The performance targets: (name, what is compared, the ratio needed).
TARGETS = [
    ("ADDJOB vs LPUSH, -P 1", ">= 1.00x", 1.00),
    ("GETJOB NOHANG vs RPOP, -P 1", ">= 0.95x", 0.95),
    ("ADDJOB vs LPUSH, -P 32", ">= 0.35x", 0.35),
    ("GETJOB NOHANG vs RPOP, -P 32", ">= 0.35x", 0.35),
]


def load(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text())
    return [{"name": b["name"], "group": b.get("group"), **b["extra_info"]}
            for b in data["benchmarks"]]


def by_group(rows: list[dict[str, Any]], group: str) -> list[dict[str, Any]]:
    return [r for r in rows if r["group"] == group]


def _axes() -> tuple[Any, Any]:
    return pyplot().subplots(figsize=(7, 4))


def _save(fig: Any, ax: Any, out: Path, title: str) -> None:
    """The look every plot here shares: rps axis, grid, legend; then ``save_figure``."""
    ax.set_ylabel("requests/s (-c 50 -n 200000)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, out)


def plot_pipeline(rows: list[dict[str, Any]], out: Path) -> None:
    rb = sorted(by_group(rows, "redis-benchmark"), key=lambda r: r["pipeline"])
    if not rb:
        return
    fig, ax = _axes()
    xs = [r["pipeline"] for r in rb]
    for key, label, style in [("lpush", "redis LPUSH", "o--"), ("addjob", "disque-mp ADDJOB", "o-"),
                              ("rpop", "redis RPOP", "s--"), ("getjob", "disque-mp GETJOB NOHANG", "s-"),
                              ("floor_addjob", "do-nothing uvloop server (ADDJOB)", "^:")]:
        if all(key in r for r in rb):
            ax.plot(xs, [r[key]["rps"] for r in rb], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("pipeline depth (redis-benchmark -P)")
    _save(fig, ax, out, "Throughput vs pipeline depth (2 workers)")


def plot_workers(rows: list[dict[str, Any]], out: Path) -> None:
    sc = next(iter(by_group(rows, "scaling")), None)
    if sc is None:
        return
    many = sc["many_queues"]
    fig, ax = _axes()
    for cmd, style in (("addjob", "o-"), ("getjob", "s--")):
        for pipeline in (1, 32):
            ax.plot([1, 2], [many[f"{cmd}_p{pipeline}_w{w}"]["rps"] for w in (1, 2)], style,
                    label=f"{cmd.upper()}, 10,000 random queues, -P {pipeline}")
    ax.set_yscale("log")
    ax.set_xticks([1, 2])
    ax.set_xlabel("worker processes")
    _save(fig, ax, out, "Throughput vs workers count (medians of interleaved rounds)")


# Targets of "every core pays": (label, needed, ratio key, where).
SCALING_TARGETS = [
    ("many queues ADDJOB, 2 workers / 1, -P 32", ">= 1.50x", "addjob_p32_ratio", "many_queues"),
    ("many queues GETJOB NOHANG, 2 workers / 1, -P 32", ">= 1.50x", "getjob_p32_ratio", "many_queues"),
    ("many queues ADDJOB, 2 workers / 1, -P 1", ">= 1.00x", "addjob_p1_ratio", "many_queues"),
    ("many queues GETJOB NOHANG, 2 workers / 1, -P 1", ">= 1.00x", "getjob_p1_ratio", "many_queues"),
    ("one queue ADDJOB vs reference Disque, -P 1", ">= 1.00x", "addjob_p1_ratio", "one_queue"),
    ("one queue GETJOB NOHANG vs reference Disque, -P 1", ">= 1.00x", "getjob_p1_ratio", "one_queue"),
    ("one queue ADDJOB vs reference Disque, -P 32", ">= 1.00x", "addjob_p32_ratio", "one_queue"),
    ("one queue GETJOB NOHANG vs reference Disque, -P 32", ">= 1.00x", "getjob_p32_ratio", "one_queue"),
]


def scaling_rows(rows: list[dict[str, Any]]) -> list[tuple[str, str, float | None, str]]:
    sc = next(iter(by_group(rows, "scaling")), None)
    out: list[tuple[str, str, float | None, str]] = []
    for label, need, key, part in SCALING_TARGETS:
        data = sc.get(part, {}) if sc else {}
        if key not in data:
            why = data.get("reference", "not run") if part == "one_queue" else "not run"
            out.append((label, need, None, why))
            continue
        stem = key.rsplit("_", 1)[0]
        a, b = ("w2", "w1") if part == "many_queues" else ("disque_mp", "reference")
        ra, rb = data[f"{stem}_{a}"], data[f"{stem}_{b}"]
        got = [(sum(r["cpu_s"]) + r["client_cpu_s"]) / max(r["wall_s"], 1e-9) for r in (ra, rb)]
        capacity = ""
        if part == "many_queues":  # what the ratio is when every worker has a core of its own
            capacity = (f"; with a core per worker (CPU per request): "
                        f"{2 * rb['server_us_per_req'] / ra['server_us_per_req']:.2f}x")
        out.append((label, need, data[key],
                    f"{ra['rps']:,.0f} vs {rb['rps']:,.0f} req/s; server CPU {ra['server_us_per_req']:.2f}"
                    f" vs {rb['server_us_per_req']:.2f} us/req, redis-benchmark "
                    f"{ra['client_us_per_req']:.2f} / {rb['client_us_per_req']:.2f} us/req; the runs got "
                    f"{got[0]:.2f} / {got[1]:.2f} cores{capacity}"))
    return out


def scaling_section(rows: list[dict[str, Any]]) -> list[str]:
    sc = next(iter(by_group(rows, "scaling")), None)
    if sc is None:
        return []
    m, r = sc["model"], sc["roles"]
    lines = ["", "## Workers and the model (bench/scaling.py)", "",
             f"Reference Disque: {sc['one_queue'].get('reference', 'not run')}. Load average "
             f"around these figures: {sc.get('loadavg_1m')}. {sc.get('rerun_note', '')}", "",
             f"CPU per command of each role (2-worker node, {r.get('conns', '?')} connections pinned "
             f"to one worker, pipelined ADDJOB -P {r['pipeline']}, per-process utime+stime, "
             f"medians of {r['rounds']} rounds): run where it arrived **{r['local_us']:.2f} us**; "
             f"arrived at the other worker, forwarded out and its reply relayed "
             f"**{r['forward_relay_us']:.2f} us** there; executed for another worker "
             f"**{r['executed_for_other_us']:.2f} us**. redis-benchmark: {m['client_us']:.2f} us "
             "per request.", "",
             "Model: with N workers and queues spread evenly, 1/N of the commands run where they "
             "arrive and the rest pay both sides of the hop; each worker uses at most one core, "
             "node and load generator together at most the machine's cores.", "",
             "| workers | req/s measured here | model here (cores the run got) | node CPU us/req "
             "measured | model | predicted req/s, a core per worker (+1 client) |",
             "|---|---|---|---|---|---|"]
    check = {str(k): v for k, v in m["check"].items()}
    pred = {str(k): v for k, v in m["predicted_rps"].items()}
    for n in ("1", "2", "4", "8", "16"):
        c = check.get(n)
        here = (f"{c['measured_rps']:,.0f} | {c['model_rps']:,.0f} ({c['cores_used']:.2f} cores) | "
                f"{c['measured_node_us']:.2f} | {c['model_node_us']:.2f}") if c else " | | | "
        lines.append(f"| {n} | {here} | {pred[n]:,.0f} |")
    lines += ["", f"Node CPU per request, 2 workers over 1: measured {m['node_us_ratio_measured']:.2f}x, "
              f"model {m['node_us_ratio_model']:.2f}x. With a core per worker the model predicts "
              f"{m['speedup_16']:.1f}x for 16 workers over one. Plot: `model_vs_workers.png`.", "",
              "Commands (ports are free ones picked per run; -c 50 -n 200000, -P 1 and -P 32):", ""]
    many = sc["many_queues"]
    one = sc["one_queue"]
    for key in ("addjob_p32_w2", "getjob_p32_w2", "addjob_p1_w1"):
        lines.append(f"- `{many[key]['command']}`")
    for key in ("addjob_p32_reference", "getjob_p32_reference"):
        if key in one:
            lines.append(f"- `{one[key]['command']}` (reference)")
    return lines


def ratio_rows(rows: list[dict[str, Any]]) -> list[tuple[str, str, float | None, str]]:
    """(target, needed, measured ratio or None, detail) for every performance target."""
    rb = {r["pipeline"]: r for r in by_group(rows, "redis-benchmark")}
    out: list[tuple[str, str, float | None, str]] = []
    for (name, need, _), (p, key, ref) in zip(TARGETS, [(1, "addjob", "lpush"), (1, "getjob", "rpop"),
                                                       (32, "addjob", "lpush"), (32, "getjob", "rpop")],
                                              strict=True):
        r = rb.get(p)
        floor = f"; do-nothing Python server {r['floor_' + key]['rps']:,.0f}" \
            if r and f"floor_{key}" in r else ""
        rounds = f", medians of {r['rounds']} interleaved runs" if r and r.get("rounds") else ""
        out.append((name, need, r[f"{key}_ratio"] if r else None,
                    f"{r[key]['rps']:,.0f} vs {r[ref]['rps']:,.0f} req/s{rounds}{floor}"
                    if r else "not run"))
    cyc = {r["name"]: r for r in by_group(rows, "loadgen cycle")}
    sat = next((r for n, r in cyc.items() if "saturate-p8" in n), None)
    rate = next((r for n, r in cyc.items() if "rate5000" in n), None)
    low = next((r for n, r in cyc.items() if "rate2000" in n), None)
    out.append(("cycle jobs/s vs Redis reliable queue (pipeline 8)", ">= 1.00x",
                sat["throughput_ratio"] if sat else None,
                f"{sat['disque']['jobs_per_s']:,.0f} vs {sat['redis']['jobs_per_s']:,.0f} jobs/s"
                if sat else "not run"))
    for label, r in (("saturated, pipeline 8", sat), ("at 5,000 jobs/s, pipeline 1", rate),
                     ("at 2,000 jobs/s, pipeline 1", low)):
        out.append((f"cycle p99 add-to-ack latency, {label}", "<= 1.00x",
                    r["p99_ratio"] if r else None,
                    f"{r['disque']['latency']['p99_us'] / 1000:.2f} vs "
                    f"{r['redis']['latency']['p99_us'] / 1000:.2f} ms" if r else "not run"))
    mem = next(iter(by_group(rows, "memory")), None)
    out.append(("memory per queued 100-byte job", "<= 550 B",
                mem["bytes_per_job"] if mem else None,
                f"{mem['jobs']:,} jobs, workers RSS {mem['empty_rss'] / 2**20:.0f} -> "
                f"{mem['full_rss'] / 2**20:.0f} MiB; redis-server "
                f"{mem['redis']['bytes_per_job']:.0f} B/item" if mem else "not run"))
    xws = sorted(by_group(rows, "cross-worker"), key=lambda r: r["pipeline"])
    for xw in xws:
        out.append((f"queue owned by another worker: throughput cost, -P {xw['pipeline']}",
                    "<= 15 %", xw["cost_pct"], xw["detail"]))
    if not xws:
        out.append(("queue owned by another worker: throughput cost", "<= 15 %", None, "not run"))
    return out


def met(name: str, need: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    limit = float(need.split()[1].rstrip("x%B"))
    ok = value >= limit if need.startswith(">=") else value <= limit
    return "yes" if ok else "**no**"


def summary(rows: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    lines = ["# Benchmark summary (bench/run_all.py)", "",
             f"Machine: {machine.get('cpus')} CPUs, {machine.get('cpu_model')}, "
             f"Linux {machine.get('kernel')}, Python {machine.get('python')}, "
             f"{machine.get('redis')}. Code at commit {machine.get('commit', '?')}, node build "
             f"{machine.get('build', '?')} (INFO workers: shard_build). "
             f"Run at {machine.get('date')} (UTC); 1-minute load "
             f"average at the start {machine.get('loadavg_1m_at_start')} (each figure below "
             "lists the load before and after it: `loadavg_1m`).", "",
             "| target | needed | measured | met | detail |", "|---|---|---|---|---|"]
    for name, need, value, detail in ratio_rows(rows) + scaling_rows(rows):
        shown = "n/a" if value is None else (
            f"{value:.0f} B" if need.endswith("B") else
            f"{value:.1f} %" if need.endswith("%") else f"{value:.2f}x")
        lines.append(f"| {name} | {need} | {shown} | {met(name, need, value)} | {detail} |")
    lines += scaling_section(rows)
    lines += ["", "## All macro figures", ""]
    for r in rows:
        if r["group"] != "scaling":
            lines.append(f"- `{r['name']}`: " + short(r))
    lines += ["", "Plots: `throughput_vs_pipeline.png`, `throughput_vs_workers.png`, "
              "`model_vs_workers.png`.", "",
              "## Commands", "",
              "Ports are free ones picked per run. Load generator runs are `bench.loadgen.run()`",
              "with the settings stored in macro.json (`disque-mp bench cycle --procs 2 "
              "--producers 2 --consumers 2 --pipeline 8 --duration-s 10`, and `--target redis`).",
              ""]
    lines += [f"- `{c}`" for c in commands(rows)]
    return "\n".join(lines) + "\n"


def commands(rows: list[dict[str, Any]]) -> list[str]:
    seen: list[str] = []
    for r in rows:
        for v in r.values():
            if isinstance(v, dict) and "command" in v and v["command"] not in seen:
                seen.append(v["command"])
    return seen


def short(r: dict[str, Any]) -> str:
    parts = []
    for k, v in r.items():
        if isinstance(v, dict) and "rps" in v:
            parts.append(f"{k} {v['rps']:,.0f} req/s (p50 {v['p50_latency_ms']} ms)")
        elif isinstance(v, dict) and "jobs_per_s" in v:
            lat = v["latency"]
            parts.append(f"{k} {v['jobs_per_s']:,.0f} jobs/s (p50 {lat['p50_us'] / 1000:.2f} ms, "
                         f"p99 {lat['p99_us'] / 1000:.2f} ms, p99.9 {lat['p999_us'] / 1000:.2f} ms)")
        elif isinstance(v, float):
            parts.append(f"{k} {v:.3f}")
        elif isinstance(v, list) and all(isinstance(x, int | float | str) for x in v):
            parts.append(f"{k} {v}")
        elif isinstance(v, int | str) and k not in ("name", "group"):
            parts.append(f"{k} {v}")
    return "; ".join(parts)


def render(macro_json: Path, machine: dict[str, Any]) -> Path:
    rows = load(macro_json)
    plot_pipeline(rows, RESULTS / "throughput_vs_pipeline.png")
    plot_workers(rows, RESULTS / "throughput_vs_workers.png")
    sc = next(iter(by_group(rows, "scaling")), None)
    if sc is not None:
        from bench.scaling import plot_model

        plot_model(sc["model"], RESULTS / "model_vs_workers.png")
    out = RESULTS / "summary.md"
    out.write_text(summary(rows, machine))
    return out


if __name__ == "__main__":
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "macro.json"
    m = RESULTS / "machine.json"
    print(render(src, json.loads(m.read_text()) if m.exists() else {}))

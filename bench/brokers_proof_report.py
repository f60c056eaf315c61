"""bench/brokers_proof.py's table: one row per point, one column per broker, each
cell what that broker did (the JSON beside it has every figure)."""

from __future__ import annotations

from typing import Any

columns = (("disque", "disque-mp"), ("redis", "Redis"), ("rabbitmq", "RabbitMQ"))


def _cell(point: str, f: dict[str, Any] | None) -> str:
    if f is None:
        return "not run"
    if "error" in f:
        return f"error: {f['error'][:80]}"
    n = point.split()[0]
    if n == "1":
        return f"{f['runs']} run(s), first {f['first_run_after_s']} s after sending"
    if n == "2":
        waiting = f.get("left_in_broker_queue", 0)
        taken = f" ({waiting:,} not yet handed to it)" if waiting else ""
        return (f"RSS {f['rss_before_mb']} -> {f['rss_after_mb']} MB "
                f"(+{f['rss_growth_mb']}) for {f['tasks']:,} tasks{taken}")
    if n == "3":
        return (f"again {max(0.0, f['rerun_after_kill_s'])} s after the SIGKILL; the "
                f"{f['long_task_s']} s task: {f['long_runs']} run(s)")
    if n == "4":
        dead = f.get("dead_letter")
        where = (f"then in dead:<queue> (same ID, nacks {dead['nacks']})" if dead
                 else f"{f['ready_after']} left queued")
        return f"{f['runs']} runs in {f['watch_s']} s, {where}"
    if n == "5":
        if f["same_delivery_id"] is None:  # the task cannot see its delivery tag
            ids = "a new message per retry (Celery's retry publishes one)"
        else:
            ids = "same job" if f["same_delivery_id"] else f"{f['delivery_ids']} messages"
        return f"{f['runs']} runs, {ids}; late by {f['late_s']} s"
    if n == "6":
        return (f"{f['lost']} lost of {f['tasks']:,}, {f['duplicates']} run twice, worker "
                f"{'never restarted' if f['worker_never_restarted'] else 'restarted'}")
    if n == "7":
        return (f"{f['shorts_before_long_ended']}/{f['shorts']} short tasks before the "
                f"{f['long_s']:.0f} s one ended; last {f['last_short_after_s']} s after")
    if n == "8":
        how = " (dedup option: DEDUP <task id>)" if f.get("dedup") else ""
        return (f"sent {f['sends']} times: Celery ran it {f['celery_runs']} time(s), "
                f"Dramatiq {f['dramatiq_runs']}{how}")
    if n == "9":
        return "; ".join(_tenant_cell(name, fig) for name, fig in f.items()
                         if isinstance(fig, dict))
    return str(f)


def _tenant_cell(name: str, f: dict[str, Any]) -> str:
    """Point 8 (bench/fair_tenants.py): where B's jobs came out behind A's backlog."""
    if f["b_last_at"] is None:
        return f"{name}: {f['b_delivered']} of B's {f['small']} in {f['deliveries_read']:,}"
    return (f"{name}: B's {f['small']} delivered at {f['b_first_at']:,}..{f['b_last_at']:,} "
            f"behind {f['backlog']:,} of A's")


def to_markdown(report: dict[str, Any]) -> str:
    res = report["results"]
    names = sorted({p for broker in res.values() for p in broker})
    s, v = report["scale"], report["versions"]
    lines = [
        "# The proof: the same Celery/Dramatiq apps on disque-mp, Redis and RabbitMQ",
        "",
        f"`python -m bench.brokers_proof{' --quick' if report['quick'] else ''}` at "
        f"{report['time']}, {report['machine']}; node {report['node_build']}, "
        f"commit {report.get('commit', '?')}; "
        f"redis-server {v['redis-server']}, rabbitmq-server {v['rabbitmq-server']}, "
        f"celery {v['celery']}, kombu {v['kombu']}, dramatiq {v['dramatiq']}; visibility "
        f"timeout (Redis) and RETRY (disque-mp) {report['visibility_s']} s; load average "
        f"{report['loadavg_1m'][0]} -> {report['loadavg_1m'][1]}.",
        *(["", f"Note: {report['note']}"] if report.get("note") else []),
        "",
        f"Counts: countdown {s['countdown_s']} s watched {s['watch_s']} s more; "
        f"{s['memory_tasks']:,} countdown=3600 tasks; poison watched {s['poison_watch_s']} s; "
        f"a {s['fair_long_s']} s task and {s['fair_shorts']} short ones; "
        f"{s['failover_tasks']:,} tasks through the failover.",
        "",
        "| point | " + " | ".join(label for _, label in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for name in names:
        cells = [_cell(name, res.get(key, {}).get(name)) for key, _ in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    for rerun in report.get("reruns", []):
        lines += ["", f"Run again at {rerun['time']} (load average {rerun['loadavg_1m'][0]} -> "
                  f"{rerun['loadavg_1m'][1]}): " + "; ".join(rerun["points"]) + "."
                  + (f" Why: {rerun['why']}." if rerun.get("why") else "")]
    lines.append("")
    return "\n".join(lines)

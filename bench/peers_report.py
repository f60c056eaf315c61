"""bench/results/peers.md, peers.json and the plots from a ``bench.peers`` run.

Ratios are disque-mp's figure divided by the peer's, in the same setting and run: for
jobs/s above 1.0 means disque-mp is faster, for latency below 1.0 means it is quicker.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

LATENCY_KEYS = ("p50_ms", "p99_ms", "p99.9_ms")
P99_VS_REDIS_LIST_MAX = 1.2  # the paced-latency target: disque-mp's p99 over Redis list's
CYCLE_CPU_VS_C_MAX = 1.3  # server CPU per job, one queue flat out, over C Disque's
PACED_CPU_VS_C_MAX = 1.5  # server CPU per job at a paced 1,000 jobs/s, over C Disque's
PROMISES = {  # what the replicated setting's systems promise when a node dies
    "disque-mp": "ADDJOB REPLICATE 3 answers once 3 nodes hold the job in memory; a job "
                 "survives the loss of any 2 of them and is queued again by a survivor after "
                 "its RETRY time (at-least-once; a job may run twice)",
    "disque-c": "the same as disque-mp (the reference's semantics)",
    "rabbitmq": "a quorum queue confirms a message once a majority (2 of 3) has it in its "
                "Raft log (written and fsynced; here on /dev/shm); it survives the loss of 1 "
                "node, and the queue stops while a majority is missing; unacked deliveries "
                "are redelivered",
    "nats": "a JetStream R3 stream acks a publish once a majority (2 of 3) has stored it "
            "(memory storage here); it survives the loss of 1 node, and the stream stops "
            "accepting while a majority is missing; unacked messages are redelivered after "
            "AckWait",
}


def medians(results: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, float]]:
    """(setting, workload, system) -> the median of every numeric figure over rounds."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["setting"], r["workload"], r["system"]), []).append(r)
    out: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, rows in groups.items():
        ok = [r for r in rows if "error" not in r]
        m: dict[str, float] = {"rounds": len(ok), "failed": len(rows) - len(ok)}
        for field in ("jobs_per_s", "server_us_per_job", "clients_us_per_job", "achieved_rate", *LATENCY_KEYS):
            vals = [r[field] for r in ok if r.get(field) is not None
                    and r[field] == r[field]]  # not NaN
            if vals:
                m[field] = statistics.median(vals)
        incomplete = [r for r in ok if r.get("complete") is False
                      or ("sent" in r and r.get("received", 0) < r["sent"])]
        m["incomplete"] = len(incomplete)
        out[key] = m
    return out


def command(setting: str, workload: str, system: str) -> str:
    wl = "cycle" if workload.startswith("cycle") else "latency"
    return (f"`python -m bench.peers --setting {setting} --workload {wl} "
            f"--systems disque-mp,{system}`" if system != "disque-mp" else
            f"`python -m bench.peers --setting {setting} --workload {wl} --systems disque-mp`")


def figure(workload: str, m: dict[str, float]) -> str:
    if workload.startswith("cycle"):
        if "jobs_per_s" not in m:
            return "failed"
        cpu = (f" ({m['server_us_per_job']:.1f} us server CPU per job)"
               if "server_us_per_job" in m else "")
        if "clients_us_per_job" in m:
            cpu += f" [clients {m['clients_us_per_job']:.1f} us per job]"
        return f"{m['jobs_per_s']:,.0f} jobs/s{cpu}"
    if "p99_ms" not in m:
        return "failed"
    cpu = (f" ({m['server_us_per_job']:.1f} us server CPU per job)"
           if "server_us_per_job" in m else "")
    return (f"p50 {m['p50_ms']:.2f} / p99 {m['p99_ms']:.2f} / p99.9 {m['p99.9_ms']:.2f} ms "
            f"at {m.get('achieved_rate', 0):,.0f}/s{cpu}")


def ratio(workload: str, ours: dict[str, float] | None, theirs: dict[str, float]) -> str:
    if ours is None:
        return ""
    if workload.startswith("cycle"):
        a, b = ours.get("jobs_per_s"), theirs.get("jobs_per_s")
        return f"{a / b:.2f}x" if a and b else ""
    parts = []
    for k in ("p50_ms", "p99_ms"):
        a, b = ours.get(k), theirs.get(k)
        parts.append(f"{a / b:.2f}x" if a and b else "-")
    return " / ".join(parts) + " (p50 / p99)"


WORKLOAD_NAMES = {"cycle-1q": "cycle, 1 queue", "cycle-100q": "cycle, 100 queues",
                  "paced-1000": "latency at 1,000/s", "paced-5000": "latency at 5,000/s",
                  "paced-half-max": "latency at half its own max"}


def table(meds: dict[tuple[str, str, str], dict[str, float]]) -> list[str]:
    lines = ["| system | setting | figure | ratio (disque-mp / system) | command |",
             "|---|---|---|---|---|"]
    order = list(WORKLOAD_NAMES)
    for (setting, workload, system), m in sorted(
            meds.items(), key=lambda kv: (kv[0][0] != "single", order.index(kv[0][1])
                                          if kv[0][1] in order else 99, kv[0][2] != "disque-mp")):
        ours = meds.get((setting, workload, "disque-mp"))
        note = ""
        if m.get("failed"):
            note += f" ({m['failed']:.0f} round(s) failed)"
        if m.get("incomplete"):
            note += f" ({m['incomplete']:.0f} round(s) incomplete)"
        r = "1.00x (itself)" if system == "disque-mp" else ratio(workload, ours, m)
        lines.append(f"| {system} | {setting}, {WORKLOAD_NAMES.get(workload, workload)} | "
                     f"{figure(workload, m)}{note} | {r} | {command(setting, workload, system)} |")
    return lines


def targets(meds: dict[tuple[str, str, str], dict[str, float]]) -> list[str]:
    """The performance targets this harness measures, each met or not."""
    lines = []

    def cyc(setting: str, wl: str, peer: str) -> None:
        ours, theirs = meds.get((setting, wl, "disque-mp")), meds.get((setting, wl, peer))
        if not ours or not theirs or "jobs_per_s" not in ours or "jobs_per_s" not in theirs:
            return
        x = ours["jobs_per_s"] / theirs["jobs_per_s"]
        lines.append(f"- {setting} {WORKLOAD_NAMES[wl]}: disque-mp / {peer} = {x:.2f}x "
                     f"(>= 1.0x: {'met' if x >= 1.0 else 'not met'})")

    for peer in ("disque-c", "rabbitmq", "nats"):
        cyc("replicated", "cycle-1q", peer)
    for wl in ("cycle-1q", "cycle-100q"):
        for peer in ("disque-mp-1w", "disque-c", "beanstalkd", "redis-streams"):
            cyc("single", wl, peer)
    def cpu(wl: str, peer: str, most: float) -> None:
        ours, theirs = meds.get(("single", wl, "disque-mp")), meds.get(("single", wl, peer))
        if not ours or not theirs or not ours.get("server_us_per_job") \
                or not theirs.get("server_us_per_job"):
            return
        x = ours["server_us_per_job"] / theirs["server_us_per_job"]
        lines.append(f"- single {WORKLOAD_NAMES[wl]}: server CPU per job disque-mp / {peer} = "
                     f"{x:.2f}x (<= {most}x: {'met' if x <= most else 'not met'})")

    cpu("cycle-1q", "disque-c", CYCLE_CPU_VS_C_MAX)
    cpu("paced-1000", "disque-c", PACED_CPU_VS_C_MAX)
    for wl in ("paced-1000", "paced-5000", "paced-half-max"):
        ours, theirs = meds.get(("single", wl, "disque-mp")), meds.get(("single", wl, "redis-list"))
        if ours and theirs and "p99_ms" in ours and "p99_ms" in theirs:
            x = ours["p99_ms"] / theirs["p99_ms"]
            lines.append(f"- single {WORKLOAD_NAMES[wl]}: p99 disque-mp / redis-list = {x:.2f}x "
                         f"(<= {P99_VS_REDIS_LIST_MAX}x: "
                         f"{'met' if x <= P99_VS_REDIS_LIST_MAX else 'not met'})")
    return lines


def markdown(data: dict[str, Any], info: dict[str, Any]) -> str:
    meds = medians(data["results"])
    head = [
        "# disque-mp against the queues users pick instead",
        "",
        f"`{info['argv']}`, {info['date']}, {info['cpus']} CPUs, {info['rounds']} interleaved "
        f"round(s), the median round; 1-minute load average {info['loadavg_1m_start']} at the "
        f"start and {info['loadavg_1m_end']} at the end ({info['minutes']} min)"
        + (" -- a quick smoke run, not a record." if info.get("quick") else ".")
        + (f" Build {info['build']}, commit {info['commit']}, machine: {info['machine']}."
           if "commit" in info else ""),
        "",
        f"Cycle: {info['clients']} producers and {info['clients']} consumers (a process each), batches of 50 "
        "100-byte jobs, jobs/s from the start to the last ack. Latency: one producer paced at "
        "the rate, one consumer, add-to-delivery. disque-mp runs "
        f"{info['single_workers']} workers on the single node, {info['replicated_workers']} per "
        "node replicated. "
        "Ratios are disque-mp divided by the system (jobs/s: > 1 is faster; latency: < 1 is "
        "quicker). Every server and every client shares this machine's cores.",
        "",
        *table(meds),
        "",
        "## Targets measured here",
        "",
        *targets(meds),
        "",
        "Celery and Dramatiq end to end (disque://, redis://, amqp://): bench/results/brokers.md "
        "(`make bench-brokers`).",
        "",
        "## What each replicated system promises when a node dies",
        "",
        *[f"- **{k}**: {v}" for k, v in PROMISES.items()],
        "",
    ]
    return "\n".join(head)


def write_all(data: dict[str, Any], info: dict[str, Any], out: Path) -> list[Path]:
    from bench.peers_plots import cdf_plot, throughput_plot

    out.mkdir(parents=True, exist_ok=True)
    md = out / "peers.md"
    md.write_text(markdown(data, info))
    js = out / "peers.json"
    js.write_text(json.dumps({"info": info, "results": data["results"],
                              "medians": [{"setting": k[0], "workload": k[1], "system": k[2], **v}
                                          for k, v in medians(data["results"]).items()]},
                             indent=1) + "\n")
    paths = [md, js]
    meds = medians(data["results"])
    if any(k[1].startswith("cycle") for k in meds):
        paths.append(throughput_plot(meds, out / "peers-throughput.png"))
    if data["samples"]:
        paths.append(cdf_plot(data["samples"], out / "peers-latency-cdf.png"))
    return paths

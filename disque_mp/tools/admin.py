"""``disque-mp admin``: the daily questions about a running node, without redis-cli.

    disque-mp admin queues                 queues holding jobs (queued, active or delayed),
                                           largest first
    disque-mp admin queue QUEUE            one queue: queued, active, delayed, dead letters ...
    disque-mp admin job ID                 one job: state, times in human units, counters
    disque-mp admin peek QUEUE [COUNT]     the oldest COUNT jobs (negative: newest first)
    disque-mp admin requeue QUEUE          dead:QUEUE's jobs back to QUEUE
    disque-mp admin limit QUEUE [--active N] [--rate N] [--group-active N] [--reset] [--bcast]
                                           QLIMIT: set a queue's limits on this node
                                           (every reachable node with --bcast), or show them
    disque-mp admin result JOB_ID [--wait MS]
                                           a job's result, or its progress while pending
    disque-mp admin node                   this node: ID, build, workers, clients, jobs, memory
    disque-mp admin cluster                the cluster as this node sees it
    disque-mp admin schedules              the SCHEDULEs: rule, queue, next and last fire
    disque-mp admin drain [--timeout S] [--no-shutdown]
                                           CLUSTER LEAVING yes, wait until no job is
                                           queued or waits for copies here, SHUTDOWN

Everything goes through the project's client (``disque_mp.client.Disque``), pinned to
the one node named by ``--node`` (no failover: the answer is about that node). The
password comes from ``--password`` or the ``DISQUE_MP_PASSWORD`` environment variable
(kept off the command line, where ``ps`` shows it). ``--json`` prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis

from disque_mp.client import Disque, DisqueConnectionError, DisqueError, Job, Progress
from disque_mp.client.core import as_str
from disque_mp.client.limits import DEAD_PREFIX  # where MAXDELIVER moves a job
from disque_mp.node import drain

queues_scanned_max = 100_000  # queue names one `queues` call looks at: bounds its memory
qstat_batch = 500  # QSTATs per pipelined round trip
body_shown_chars = 60  # a job body in peek's table is cut here (--json shows it whole)
shutdown_wait_s = 30.0  # after a drain's SHUTDOWN: how long to wait for the port to close

# INFO fields `admin node` shows, in this order (label, INFO key)
NODE_FIELDS = (
    ("disque_mp_version", "disque_mp_version"), ("protocol_version", "disque_version"),
    ("build", "shard_build"),
    ("uptime_s", "uptime_in_seconds"), ("workers", "workers"), ("tcp_port", "tcp_port"),
    ("clients", "connected_clients"), ("blocked_clients", "blocked_clients"),
    ("jobs", "registered_jobs"), ("queues", "registered_queues"),
    ("memory", "used_memory_human"), ("maxmemory", "maxmemory_human"),
    ("aof", "aof_enabled"), ("aof_last_write", "aof_last_write_status"),
    ("results", "results"), ("results_bytes", "results_bytes"),
    ("progress_jobs", "progress_jobs"), ("dedup_keys_kept", "dedup_keys_kept"),
)


class AdminError(Exception):
    """What the operator did wrong (bad queue name, nothing to requeue ...): one line, exit 1."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="disque-mp admin", description="Ask a running disque-mp node the daily questions.")
    p.add_argument("--node", default="127.0.0.1:7711", help="host:port (default 127.0.0.1:7711)")
    p.add_argument("--password", default=os.environ.get("DISQUE_MP_PASSWORD"),
                   help="requirepass (default: $DISQUE_MP_PASSWORD)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of a table")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    q = sub.add_parser("queues", help="queues holding jobs (queued, active or delayed), "
                                      "largest first")
    q.add_argument("--limit", type=int, default=50, help="rows shown (default 50)")
    q.add_argument("--all", action="store_true", help="include empty queues")
    one = sub.add_parser("queue", help="one queue: queued, active, delayed, dead letters, pause")
    one.add_argument("queue")
    jb = sub.add_parser("job", help="one job: state, creation date, TTL, retry, counters")
    jb.add_argument("id")
    pk = sub.add_parser("peek", help="jobs at the head of a queue, nothing consumed")
    pk.add_argument("queue")
    pk.add_argument("count", type=int, nargs="?", default=10,
                    help="how many (default 10; negative: the newest first)")
    rq = sub.add_parser("requeue", help="dead:QUEUE's jobs back to QUEUE (REDRIVE: same IDs)")
    rq.add_argument("queue", help="QUEUE or dead:QUEUE")
    rq.add_argument("--max", type=int, default=10_000, help="at most this many (default 10000)")
    _limit_parser(sub)
    rs = sub.add_parser("result", help="a job's result (ACKJOB ... RESULT), or its progress")
    rs.add_argument("job_id")
    rs.add_argument("--wait", type=int, default=None, metavar="MS",
                    help="wait for a pending job this long (RESULT ... TIMEOUT; 0: until done)")
    sub.add_parser("node", help="this node: ID, build, workers, clients, jobs, memory, AOF")
    sub.add_parser("cluster", help="the cluster as this node sees it: state and nodes")
    sub.add_parser("schedules", help="the SCHEDULEs: rule, queue, next and last fire, counts")
    dr = sub.add_parser("drain", help="move this node's jobs to the others, then SHUTDOWN "
                                      "(CLUSTER LEAVING yes first)")
    dr.add_argument("--timeout", type=float, default=drain.drain_timeout_s_default,
                    help="seconds to wait for the jobs to move (default "
                         f"{drain.drain_timeout_s_default:g}); past it the node stays LEAVING")
    dr.add_argument("--no-shutdown", action="store_true",
                    help="only drain: leave the node running (and LEAVING)")
    dr.add_argument("--interval", type=float, default=drain.progress_interval_s,
                    help=f"seconds between progress lines (default {drain.progress_interval_s:g})")
    return p


# --------------------------------------------------------------------------- queues


def queue_rows(d: Disque, include_empty: bool) -> list[dict[str, Any]]:
    """QSTAT of every queue the node knows (QSCAN), largest first (queued, then
    active and delayed), ties by name; without ``include_empty`` only the queues
    holding a job in some state, or a blocked client."""
    names: list[str] = []
    seen: set[str] = set()
    for name in d.iter_queues(count=1000):
        if name not in seen:
            seen.add(name)
            names.append(name)
        if len(names) >= queues_scanned_max:
            break
    rows = []
    for start in range(0, len(names), qstat_batch):
        chunk = names[start:start + qstat_batch]
        replies = d.execute_many([("QSTAT", n) for n in chunk], raise_on_error=False)
        for name, reply in zip(chunk, replies, strict=True):
            if reply is None or isinstance(reply, DisqueError):
                continue  # gone between QSCAN and QSTAT
            row = _queue_row(name, _pairs(reply) or {})
            if include_empty or any(row[k] for k in ("queued", "active", "delayed", "blocked")):
                rows.append(row)
    rows.sort(key=lambda r: (-r["queued"], -r["active"] - r["delayed"], r["name"]))
    return rows


def _queue_row(name: str, stat: dict[str, Any]) -> dict[str, Any]:
    """A QSTAT reply as a row: active is delivered and not acknowledged, delayed
    waits for its ADDJOB DELAY, dead the jobs queued in dead:<queue>."""
    return {"name": name, "queued": int(stat.get("len", 0)), "active": int(stat.get("active", 0)),
            "delayed": int(stat.get("delayed", 0)), "dead": int(stat.get("dead-len", 0)),
            "age_s": int(stat.get("age", 0)), "idle_s": int(stat.get("idle", 0)),
            "oldest_age_s": int(stat.get("oldest-age", 0)), "blocked": int(stat.get("blocked", 0)),
            "pause": as_str(stat.get("pause", b"none")),
            "import_rate": int(stat.get("import-rate", 0))}


def cmd_queues(d: Disque, args: argparse.Namespace) -> Any:
    rows = queue_rows(d, args.all)
    shown = rows[:max(args.limit, 0)]
    if args.json:
        return {"queues": shown, "total": len(rows)}
    table = [("QUEUE", "QUEUED", "ACTIVE", "DELAYED", "DEAD", "BLOCKED", "AGE_S", "PAUSE")]
    table += [(r["name"], str(r["queued"]), str(r["active"]), str(r["delayed"]), str(r["dead"]),
               str(r["blocked"]), str(r["age_s"]), r["pause"]) for r in shown]
    more = f"\n({len(rows) - len(shown)} more: --limit)" if len(rows) > len(shown) else ""
    if not rows:
        return "no queue holds a job, queued, active or delayed (--all lists empty ones too)"
    return _table(table) + more


def cmd_queue(d: Disque, args: argparse.Namespace) -> Any:
    stat = d.qstat(args.queue)
    if stat is None:
        raise AdminError(f"the node knows no queue {args.queue!r}")
    row = _queue_row(args.queue, stat)
    if args.json:
        return row
    return _table([
        ("queue", row["name"]), ("queued", str(row["queued"])),
        ("active", f"{row['active']} (delivered, not acknowledged)"),
        ("delayed", f"{row['delayed']} (DELAY not over)"),
        ("dead letters", f"{row['dead']} (in {DEAD_PREFIX}{row['name']})"),
        ("oldest queued", human_s(row["oldest_age_s"]) if row["queued"] else "-"),
        ("blocked clients", str(row["blocked"])), ("pause", row["pause"]),
        ("age", human_s(row["age_s"])), ("idle", human_s(row["idle_s"]))])


# --------------------------------------------------------------------------- job


def human_s(s: float) -> str:
    """Seconds in the largest units that read well: 45 s, 5 min 30 s, 23 h 59 min, 2 d 3 h."""
    n = max(0, round(s))
    for unit_s, unit, sub_s, sub in ((86400, "d", 3600, "h"), (3600, "h", 60, "min"),
                                     (60, "min", 1, "s")):
        if n >= unit_s:
            rest = n % unit_s // sub_s
            return f"{n // unit_s} {unit}" + (f" {rest} {sub}" if rest else "")
    return f"{n} s"


def _ms(ms: int) -> str:
    return f"in {ms} ms" if 0 < ms < 1000 else f"in {human_s(ms / 1000)}" if ms else "-"


def job_lines(show: dict[str, Any]) -> list[tuple[str, str]]:
    """SHOW's fields as label and text, times in their units (SHOW's raw numbers are
    ns, s and ms: ``--json`` prints them as they are)."""
    ctime_s = int(show["ctime"]) / 1e9
    created = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ctime_s))
    retry = int(show["retry"])
    lines = [
        ("id", as_str(show["id"])), ("queue", as_str(show["queue"])),
        ("state", as_str(show["state"])), ("repl", str(show["repl"])),
        ("created", f"{created} ({human_s(time.time() - ctime_s)} ago)"),
        ("ttl", f"{human_s(int(show['ttl']))} left"),
        ("delay", human_s(int(show["delay"])) if int(show["delay"]) else "none"),
        ("retry", human_s(retry) if retry else "0 (at most once: never requeued)"),
        ("nacks", str(show["nacks"])),
        ("additional deliveries", str(show["additional-deliveries"])),
        ("next requeue", _ms(int(show["next-requeue-within"]))),
        ("next awake", _ms(int(show["next-awake-within"])))]
    for key in ("maxdeliver", "dead-reason", "group", "dedup"):
        if key in show:
            lines.append((key, as_str(show[key])))
    body = show["body"].decode("utf-8", "backslashreplace")
    lines.append(("body", body if len(body) <= body_shown_chars else body[:body_shown_chars] + "..."))
    return lines


def cmd_job(d: Disque, args: argparse.Namespace) -> Any:
    show = d.show(args.id)
    if show is None:
        raise AdminError(f"the node knows no job {args.id}")
    if args.json:
        return {k: (v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else
                    [as_str(x) for x in v] if isinstance(v, list) else v)
                for k, v in show.items()}
    return _table([(k, v.replace("\n", "\\n")) for k, v in job_lines(show)])


# --------------------------------------------------------------------------- peek


def _job_dict(job: Job, show: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": job.id, "queue": job.queue,
                           "body": job.body.decode("utf-8", "backslashreplace")}
    if show is not None:
        for key in ("nacks", "additional-deliveries", "ctime", "ttl", "retry", "maxdeliver"):
            if key in show:
                out[key] = show[key]
    return out


def cmd_peek(d: Disque, args: argparse.Namespace) -> Any:
    if args.count == 0:
        raise AdminError("COUNT must not be 0 (positive: oldest first, negative: newest first)")
    jobs = d.qpeek(args.queue, args.count)
    shows = d.execute_many([("SHOW", j.id) for j in jobs], raise_on_error=False) if jobs else []
    found = [_job_dict(j, _pairs(s)) for j, s in zip(jobs, shows, strict=True)]
    if args.json:
        return {"queue": args.queue, "jobs": found}
    if not found:
        return f"queue {args.queue!r} has no queued job"
    table = [("ID", "NACKS", "DELIVERIES", "BODY")]
    for j in found:
        body = j["body"] if len(j["body"]) <= body_shown_chars else j["body"][:body_shown_chars] + "..."
        table.append((j["id"], str(j.get("nacks", "")), str(j.get("additional-deliveries", "")),
                      body.replace("\n", "\\n")))
    return _table(table)


def _pairs(reply: Any) -> dict[str, Any] | None:
    if reply is None or isinstance(reply, DisqueError):
        return None
    return {as_str(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


# --------------------------------------------------------------------------- requeue


def cmd_requeue(d: Disque, args: argparse.Namespace) -> Any:
    """REDRIVE: the dead letters back to their queue, same ID, TTL, RETRY and
    MAXDELIVER, delivery counters reset (a poison job gets its n deliveries again)."""
    target = args.queue[len(DEAD_PREFIX):] if args.queue.startswith(DEAD_PREFIX) else args.queue
    if not target:
        raise AdminError(f"no queue named after {DEAD_PREFIX!r}")
    dead = DEAD_PREFIX + target
    moved = 0
    while moved < args.max:
        try:  # each call moves at most the node's redrive-count-max
            n = d.redrive(dead, args.max - moved)
        except DisqueError as e:  # the queue is paused in input: nothing of this call moved
            raise AdminError(f"requeued {moved} from {dead} to {target}, then: {e}") from None
        if not n:
            break
        moved += n
    left = d.qlen(dead)
    if args.json:
        return {"from": dead, "to": target, "requeued": moved, "left": left}
    return f"requeued {moved} jobs from {dead} to {target}; {left} left in {dead}"


# --------------------------------------------------------------------------- limit


def _limit_parser(sub: Any) -> None:
    lm = sub.add_parser("limit", help="a queue's QLIMIT limits on this node: set or show")
    lm.add_argument("queue")
    lm.add_argument("--active", type=int, help="at most N jobs delivered and not done (0: none)")
    lm.add_argument("--rate", type=int, help="at most N deliveries a second (0: none)")
    lm.add_argument("--group-active", type=int,
                    help="at most N jobs delivered and not done per GROUP (0: none)")
    lm.add_argument("--reset", action="store_true", help="take every limit away")
    lm.add_argument("--bcast", action="store_true",
                    help="on every reachable node (each applies it to its own deliveries)")


def cmd_limit(d: Disque, args: argparse.Namespace) -> Any:
    """QLIMIT: the limits given set (the others kept), --reset, or none given: shown."""
    values = (args.active, args.rate, args.group_active)
    if args.reset and any(v is not None for v in values):
        raise AdminError("--reset takes no --active, --rate or --group-active")
    if args.reset:
        limits = d.reset_limits(args.queue, bcast=args.bcast)
    elif any(v is not None for v in values):
        limits = d.set_limit(args.queue, active=args.active, rate=args.rate,
                             group_active=args.group_active, bcast=args.bcast)
    elif args.bcast:
        raise AdminError("--bcast needs a limit to send (--active, --rate, --group-active "
                         "or --reset)")
    else:
        limits = d.limits(args.queue)
    if args.json:
        return {"queue": args.queue, **limits}
    rows = [("LIMIT", "VALUE")] + [(k, str(v)) for k, v in limits.items()]
    return f"{args.queue} on {args.node} (0: no limit; limits are per node)\n" + _table(rows)
# --------------------------------------------------------------------------- result


def _text(value: bytes) -> str:
    return value.decode("utf-8", "backslashreplace")


def cmd_result(d: Disque, args: argparse.Namespace) -> Any:
    """RESULT: the value, the progress of a pending job, or that there is none."""
    got = d.result(args.job_id, timeout_ms=args.wait)
    if isinstance(got, Progress):
        state, value = "progress", _text(got.value)
    elif got is None:
        state, value = "none", None
    else:
        state, value = "result", _text(got)
    if args.json:
        return {"id": args.job_id, "state": state, "value": value}
    if value is None:
        return f"{args.job_id}: no result (pending without progress, or none kept)"
    return f"{args.job_id} {state}: {value}"


# --------------------------------------------------------------------------- node, cluster


def cmd_node(d: Disque, args: argparse.Namespace) -> Any:
    info = d.info("all")
    out: dict[str, Any] = {"id": d.hello().node_id, "node": args.node}
    out.update((label, info[key]) for label, key in NODE_FIELDS if key in info)
    if args.json:
        return out
    return _table([(k, str(v)) for k, v in out.items()])


def cluster_state(d: Disque) -> dict[str, Any]:
    info = {k: v for k, v in (line.split(":", 1) for line in
                              as_str(d.execute("CLUSTER", "INFO")).splitlines() if ":" in line)}
    nodes = []
    for line in as_str(d.execute("CLUSTER", "NODES")).splitlines():
        fields = line.split()
        if len(fields) >= 6:
            nodes.append({"id": fields[0], "address": fields[1], "flags": fields[2],
                          "link": fields[5]})
    return {"state": info.get("cluster_state", "?"),
            "known_nodes": int(info.get("cluster_known_nodes", 0)),
            "reachable_nodes": int(info.get("cluster_reachable_nodes", 0)), "nodes": nodes}


def cmd_cluster(d: Disque, args: argparse.Namespace) -> Any:
    state = cluster_state(d)
    if args.json:
        return state
    head = (f"cluster_state:{state['state']}  known nodes: {state['known_nodes']}  "
            f"reachable: {state['reachable_nodes']}\n")
    rows = [("ID", "ADDRESS", "FLAGS", "LINK")]
    rows += [(n["id"], n["address"], n["flags"], n["link"]) for n in state["nodes"]]
    return head + _table(rows)


# --------------------------------------------------------------------------- drain


def drain_progress(d: Disque) -> drain.Progress:
    """What a drain waits for: INFO jobs, HELLO, CLUSTER LEAVING."""
    hello = d.hello()
    leaving = as_str(d.execute("CLUSTER", "LEAVING")).lower() == "yes"
    return drain.progress(d.info("jobs"), hello.node_id,
                          [(n.id, n.priority) for n in hello.nodes], leaving)


def repl_max(d: Disque) -> int:
    """The highest REPLICATE among the jobs a drain moves or waits for (JSCAN, bounded)."""
    seen = 0
    top = 0
    for job in d.iter_jobs(states=drain.REPL_CHECK_STATES, count=drain.jscan_count,
                           reply_all=True):
        top = max(top, drain.repl_of([job]))
        seen += 1
        if seen >= drain.repl_check_jobs_max:
            break
    return top


def _say(args: argparse.Namespace, p: drain.Progress) -> None:
    """A progress line: text on stdout, or with --json one JSON object a line on
    stderr (stdout keeps the one final document)."""
    if args.json:
        print(json.dumps(p.as_dict()), file=sys.stderr, flush=True)
    else:
        print(p.line(), flush=True)


def _shutdown(d: Disque, node: str) -> None:
    """SHUTDOWN (no reply: the connection closes), then wait for the port to close."""
    try:
        d.execute("SHUTDOWN")
    except (DisqueConnectionError, redis.ConnectionError, redis.TimeoutError, OSError):
        pass  # the node closed the connection: what a successful SHUTDOWN does
    host, _, port = node.rpartition(":")
    deadline = time.monotonic() + shutdown_wait_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        except OSError:
            return
        time.sleep(0.1)
    raise AdminError(f"drained, but {node} still accepts connections {shutdown_wait_s:g} s "
                     "after SHUTDOWN")


def cmd_drain(d: Disque, args: argparse.Namespace) -> Any:
    """CLUSTER LEAVING yes; wait until no job is queued or waits for its copies here
    (consumers on the other nodes take them by federation); SHUTDOWN. Refuses first,
    changing nothing, where a job would have no other node to hold it."""
    p = drain_progress(d)
    why = drain.refusal(p, repl_max(d) if p.left else 0)
    if why is not None:
        raise AdminError(why)
    d.execute("CLUSTER", "LEAVING", "yes")
    deadline = time.monotonic() + max(args.timeout, 0)
    while True:
        p = drain_progress(d)
        _say(args, p)
        if p.done:
            break
        if time.monotonic() >= deadline:
            raise AdminError(drain.timeout_text(p, args.timeout))
        time.sleep(max(min(args.interval, deadline - time.monotonic()), 0.01))
    if not args.no_shutdown:
        _shutdown(d, args.node)
    result = {**p.as_dict(), "node": args.node, "shutdown": not args.no_shutdown}
    if args.json:
        return result
    if args.no_shutdown:
        return f"drained {args.node}: no job left to move; the node runs, LEAVING"
    return f"drained {args.node}: no job left to move; the node is shut down"


# --------------------------------------------------------------------------- schedules


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000)) + "Z"


def cmd_schedules(d: Disque, args: argparse.Namespace) -> Any:
    rows = d.schedules()
    for row in rows:  # the ADDJOB words as text (a body may be any bytes)
        row["addjob"] = [w.decode("utf-8", "backslashreplace") for w in row["addjob"]]
    if args.json:
        return {"schedules": rows}
    if not rows:
        return "no schedule (SCHEDULE SET adds one)"
    table = [("NAME", "RULE", "QUEUE", "NEXT", "LAST", "FIRED", "SKIPPED", "FIRER")]
    table += [(r["name"], r["rule"], r["addjob"][0], _when(r["next-fire"]), _when(r["last-fire"]),
               str(r["fired"]), str(r["skipped"]), r["firer"]) for r in rows]
    return _table(table)


# --------------------------------------------------------------------------- output, main


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    return "\n".join(lines)


COMMANDS: dict[str, Callable[[Disque, argparse.Namespace], Any]] = {
    "queues": cmd_queues, "peek": cmd_peek, "requeue": cmd_requeue, "limit": cmd_limit,
    "result": cmd_result,
    "node": cmd_node, "cluster": cmd_cluster, "drain": cmd_drain, "schedules": cmd_schedules,
    "queue": cmd_queue, "job": cmd_job,
}


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        d = Disque(args.node, password=args.password, failover_attempts=0,
                   follow_priority=False, socket_timeout=30)
    except ValueError as e:
        print(f"disque-mp admin: {e}", file=sys.stderr)
        return 2
    try:
        result = COMMANDS[args.command](d, args)
    except (AdminError, DisqueError, ValueError) as e:
        print(f"disque-mp admin: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"disque-mp admin: cannot reach {args.node}: {e}", file=sys.stderr)
        return 1
    finally:
        d.close()
    try:
        print(json.dumps(result, indent=1) if args.json else result, flush=True)
    except BrokenPipeError:  # `disque-mp admin queues | head`: the reader has enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0

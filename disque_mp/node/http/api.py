"""Routes of the HTTP endpoint: the dashboard's files, ``/metrics`` and the JSON API.

The API has the semantics of the commands because it runs them (``commands.call``):

    GET    /api/overview                 node totals (INFO-like), per worker
    GET    /api/queues[?limit=N]         largest queues with sizes and in/out rates
    GET    /api/queues/{queue}           QSTAT; the first queued jobs (QPEEK) with their
                                         counters and times (SHOW); the jobs not queued here
                                         (JSCAN STATE active) split into ``active`` (delivered,
                                         not acknowledged) and ``delayed`` (a DELAY not over, or
                                         waiting: ``kind`` says which); and, for a queue with
                                         dead letters, the first jobs of dead:{queue} with
                                         their reasons (``dead``)
    POST   /api/queues/{queue}/pause     {"state": "in"|"out"|"all"|"none"} (default all)
    POST   /api/queues/{queue}/resume    PAUSE queue none
    GET    /api/queues/{queue}/limits    QLIMIT queue: this node's limits and what is in use
    POST   /api/queues/{queue}/limits    {"active": n, "rate": n, "group_active": n, "reset":
                                         true, "bcast": true} (each optional; 0 takes one away)
    POST   /api/queues/{queue}/requeue   REDRIVE: dead-letter queue -> its queue (dead:q -> q),
                                         each job with its ID
    GET    /api/jobs/{id}                SHOW; an active job's ``kind`` (delivered, delayed,
                                         waiting)
    DELETE /api/jobs/{id}                DELJOB
    POST   /api/jobs/{id}/ack            ACKJOB
    POST   /api/jobs/{id}/nack           NACK (only an active job)
    POST   /api/jobs/{id}/enqueue        ENQUEUE: "run now" for a job not queued (a DELAY
                                         cut short); 409 for a job queued already
    POST   /api/jobs/{id}/dead           DEADLETTER: to dead:{queue}, same ID; {"reason": text}
    POST   /api/queues/dead:{q}/requeue  with {"id": job}: that one dead letter back to q
                                         (REDRIVE dead:q ID job)
    GET    /api/nodes                    HELLO and the cluster view (flags, links)
    POST   /api/drain                    {"timeout_s": S, "shutdown": true|false}: CLUSTER
                                         LEAVING yes, then (in the background) SHUTDOWN once
                                         no job is queued or waits for copies here (drain.py)
    GET    /api/drain                    what a drain waits for: jobs left, leaving, peers
    GET    /healthz, /readyz             liveness and readiness probes (health.py)

Errors are ``{"error": text, "status": code}``: 400 bad job ID or body, 404 unknown
path, queue or job, 405 wrong method (with ``Allow``), 409 a job in a state the
action does not apply to, 415 a POST without ``Content-Type: application/json``
(a cross-site form cannot send one without a preflight, which is refused).
Queue names travel percent-encoded in the path; names that are not UTF-8 are
shown with replacement characters and cannot be acted on from the API.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bus.clock import wall_ms
from disque_mp.client.limits import DEAD_PREFIX
from disque_mp.node import drain
from disque_mp.node.http import health
from disque_mp.node.http import metrics as metricsmod
from disque_mp.node.http.commands import ReplyError, call
from disque_mp.node.http.ops import gather
from disque_mp.node.http.server import Request, Response, error
from workers.ids import is_valid_job_id
from workers.job import dead_reason_bytes_max

if TYPE_CHECKING:
    from disque_mp.node.view import NodeView

log = logging.getLogger("disque_mp.node.http")

queue_jobs_default = 50  # jobs shown by GET /api/queues/{queue} without ?count
queues_default = 100  # queues listed by GET /api/queues without ?limit
jscan_calls_max = 8  # JSCAN calls one queue view spends looking for its active jobs
dead_reason = "moved from the HTTP API"  # DEADLETTER's REASON when the request names none
rate_interval_ms = 1000  # queue rates are recomputed at most this often
# SHOW's fields a queue view adds to each queued job: counters, times, a dead letter's reason
counter_fields = ("nacks", "additional-deliveries", "maxdeliver", "ctime", "ttl", "delay",
                  "retry", "next-requeue-within", "dead-reason")

STATIC_DIR = Path(__file__).resolve().parent / "static"
STATIC_TYPES = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
                "app.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml",
                "schedules.js": "text/javascript; charset=utf-8"}

Handler = Callable[["NodeView", Request, list[str]], Awaitable[Response]]


class ApiError(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status


def ok(value: Any, status: int = 200) -> Response:
    return Response(status, orjson.dumps(value))


def text(raw: Any) -> Any:
    """A reply value made JSON-able: bytes as UTF-8 text (replacement characters)."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    if isinstance(raw, list):
        return [text(v) for v in raw]
    return raw


def pairs(reply: list[Any]) -> dict[str, Any]:
    """A flat [key, value, ...] reply (SHOW, QSTAT) as a dict."""
    return {text(reply[i]): text(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


# ------------------------------------------------------------------ static files and metrics


def _static(name: str) -> Response:
    ctype = STATIC_TYPES.get(name)
    if ctype is None:
        return error(404, "no such file")
    try:
        body = (STATIC_DIR / name).read_bytes()
    except OSError:
        return error(404, "no such file")
    return Response(200, body, ctype)


async def get_index(w: NodeView, req: Request, args: list[str]) -> Response:
    return _static("index.html")


async def get_static(w: NodeView, req: Request, args: list[str]) -> Response:
    return _static(args[0])


async def get_metrics(w: NodeView, req: Request, args: list[str]) -> Response:
    parts = await gather(w, "http.metrics", w.cfg.http_metrics_queues_max)
    return Response(200, metricsmod.render(w, parts), metricsmod.CONTENT_TYPE)


# ------------------------------------------------------------------ node and queues


def _alive(parts: list[Any]) -> list[dict[str, Any]]:
    return [p for p in parts if isinstance(p, dict)]


async def get_overview(w: NodeView, req: Request, args: list[str]) -> Response:
    parts = await gather(w, "http.metrics", 0)
    live = _alive(parts)

    def total(key: str) -> int:
        return sum(int(p["metrics"][key]) for p in live)

    mem = [p.get("mem") or {} for p in live]
    return ok({
        "node_id": w.node_id, "port": w.cfg.port, "workers": w.workers,
        "uptime_s": int(time.time() - w.start_s),
        "jobs": total("jobs"), "queues": total("queues"), "queued": total("queued"),
        "active": total("active"), "delayed": total("delayed"),
        "added": total("added"), "delivered": total("delivered"), "acked": total("acked"),
        "nacked": total("nacked"), "expired": total("expired"),
        "clients": sum(int(p["clients"]) for p in live),
        "blocked": sum(int(p["blocked"]) for p in live),
        "ops_per_sec": sum(int(p["ops_per_sec"]) for p in live),
        "memory_used": sum(int(m.get("used", 0)) for m in mem), "maxmemory": w.cfg.maxmemory,
        "memory_level": max([int(m.get("level", 0)) for m in mem] or [0]),
        "per_worker": [None if not isinstance(p, dict) else {
            "worker": i, "pid": p["pid"], "jobs": p["metrics"]["jobs"],
            "queues": p["metrics"]["queues"], "clients": p["clients"], "rss": p["rss"],
            "ops_per_sec": p["ops_per_sec"]} for i, p in enumerate(parts)],
    })


class Rates:
    """Per-queue in/out rates for the API, from the totals of successive requests
    served by this worker (each worker keeps its own: bounded by the queues listed)."""

    def __init__(self) -> None:
        self.last: dict[bytes, tuple[int, int, int]] = {}
        self.rates: dict[bytes, tuple[float, float]] = {}

    def update(self, name: bytes, now_ms: int, jobs_in: int, jobs_out: int) -> tuple[float, float]:
        prev = self.last.get(name)
        if prev is None or jobs_in < prev[1] or jobs_out < prev[2]:
            self.last[name] = (now_ms, jobs_in, jobs_out)
            return self.rates.get(name, (0.0, 0.0))
        dt_ms = now_ms - prev[0]
        if dt_ms >= rate_interval_ms:
            self.rates[name] = ((jobs_in - prev[1]) * 1000 / dt_ms, (jobs_out - prev[2]) * 1000 / dt_ms)
            self.last[name] = (now_ms, jobs_in, jobs_out)
        return self.rates.get(name, (0.0, 0.0))

    def bound(self, keep_max: int) -> None:
        if len(self.last) > keep_max:
            self.last.clear()
            self.rates.clear()


_rates = Rates()


def _int_param(req: Request, name: str, default: int, hi: int) -> int:
    values = urllib.parse.parse_qs(req.query).get(name)
    if not values:
        return min(default, hi)
    if not (values[0].isascii() and values[0].isdigit()):  # "\xb2".isdigit() holds
        raise ApiError(400, f"{name} must be a non-negative integer")
    return min(int(values[0]), hi)


async def get_queues(w: NodeView, req: Request, args: list[str]) -> Response:
    cap = w.cfg.http_metrics_queues_max
    limit = _int_param(req, "limit", queues_default, cap)
    parts = await gather(w, "http.metrics", limit)
    live = _alive(parts)
    rows = metricsmod.merge_queue_rows(live, limit)
    now_ms = wall_ms()
    _rates.bound(4 * max(cap, 1))
    out = []
    for name, queued, active, delayed, age_ms, jin, jout, blocked, pause, imp, dead in rows:
        in_rate, out_rate = _rates.update(name, now_ms, jin, jout)
        out.append({"name": text(name), "queued": queued, "active": active, "delayed": delayed,
                    "oldest_age_s": age_ms / 1000 if age_ms >= 0 else None, "jobs_in": jin,
                    "jobs_out": jout, "in_rate": round(in_rate, 2), "out_rate": round(out_rate, 2),
                    "blocked": blocked, "pause": pause, "import_rate": imp, "dead": dead})
    return ok({"queues": out, "total": sum(int(p["metrics"]["queues"]) for p in live),
               "limit": limit, "time_ms": now_ms})


def _queue_name(raw: str) -> bytes:
    name = urllib.parse.unquote_to_bytes(raw)
    if not name:
        raise ApiError(400, "empty queue name")
    return name


async def _pairs_or_404(w: NodeView, cmd: bytes, key: bytes, what: str) -> dict[str, Any]:
    """``cmd key``'s reply (QSTAT, SHOW) as a dict; a null reply is a 404 naming ``what``."""
    reply = await call(w, cmd, key)
    if reply is None:
        raise ApiError(404, f"unknown {what} '{text(key)}'")
    return pairs(reply)


async def _qstat(w: NodeView, name: bytes) -> dict[str, Any]:
    return await _pairs_or_404(w, b"QSTAT", name, "queue")


async def get_queue(w: NodeView, req: Request, args: list[str]) -> Response:
    name = _queue_name(args[0])
    count = _int_param(req, "count", queue_jobs_default, w.cfg.http_api_jobs_max)
    stat = await _qstat(w, name)
    queued = await _queued_jobs(w, name, count)
    waiting, complete = await _scan_jobs(w, name, "active", count)
    kinds = await _job_kinds(w, [str(j["id"]) for j in waiting])
    for job in waiting:
        job["kind"] = kinds.get(str(job["id"]), "waiting")
    dead: list[dict[str, Any]] = []
    if not name.startswith(DEAD_PREFIX.encode()) and int(stat.get("dead-len", 0)):
        dead = await _queued_jobs(w, DEAD_PREFIX.encode() + name, count)
    return ok({"queue": stat, "jobs": queued,
               "active": [j for j in waiting if j["kind"] == "delivered"],
               "delayed": [j for j in waiting if j["kind"] != "delivered"],
               "active_scan_complete": complete, "dead": dead})


async def _queued_jobs(w: NodeView, name: bytes, count: int) -> list[dict[str, Any]]:
    """The first ``count`` jobs queued in ``name`` (QPEEK), with SHOW's counters and times."""
    peek = await call(w, b"QPEEK", name, count)
    jobs = [{"id": text(e[1]), "body": text(e[2]), "state": "queued", "queue": text(name)}
            for e in peek]
    await _add_counters(w, jobs)
    return jobs


async def _job_kinds(w: NodeView, job_ids: list[str]) -> dict[str, str]:
    """What each active job waits for (delivered, delayed, waiting), asked of the
    workers that hold them (ops.job_kinds): SHOW does not say."""
    if not job_ids:
        return {}
    kinds: dict[str, str] = {}
    for part in _alive(await gather(w, "http.job_kinds", job_ids)):
        kinds.update(part)
    return kinds


async def _add_counters(w: NodeView, jobs: list[dict[str, Any]]) -> None:
    """SHOW's delivery counters on each listed job: nacks, additional-deliveries and,
    for a job created with MAXDELIVER (what moves it to dead:<queue>), maxdeliver."""
    for job in jobs:
        shown = await call(w, b"SHOW", job["id"].encode())
        if shown is None:  # acknowledged since QPEEK
            continue
        fields = pairs(shown)
        for key in counter_fields:
            if key in fields:
                job[key] = fields[key]


async def _scan_jobs(w: NodeView, name: bytes, state: str, count: int) -> tuple[list[Any], bool]:
    """Jobs of ``name`` in ``state`` (JSCAN ... REPLY all), at most ``count``, with a
    bounded number of JSCAN calls; False when the scan stopped before the end."""
    cursor = b"0"
    found: list[Any] = []
    for _ in range(jscan_calls_max):
        reply = await call(w, b"JSCAN", cursor, b"COUNT", max(count, 100), b"QUEUE", name,
                           b"STATE", state, b"REPLY", b"all")
        cursor, items = reply[0], reply[1]
        found += [pairs(item) for item in items]
        if cursor == b"0" or len(found) >= count:
            return found[:count], cursor == b"0"
    return found[:count], False


async def post_pause(w: NodeView, req: Request, args: list[str]) -> Response:
    name = _queue_name(args[0])
    body = _json_body(req)
    state = body.get("state", "all")
    if state not in ("in", "out", "all", "none"):
        raise ApiError(400, "state must be one of in, out, all, none")
    await _qstat(w, name)
    reply = await call(w, b"PAUSE", name, state)
    return ok({"queue": text(name), "pause": text(reply)})


async def post_resume(w: NodeView, req: Request, args: list[str]) -> Response:
    name = _queue_name(args[0])
    _json_body(req)
    await _qstat(w, name)
    reply = await call(w, b"PAUSE", name, b"none")
    return ok({"queue": text(name), "pause": text(reply)})


_LIMIT_FIELDS = (("active", b"ACTIVE"), ("rate", b"RATE"), ("group_active", b"GROUP-ACTIVE"))


async def get_limits(w: NodeView, req: Request, args: list[str]) -> Response:
    """QLIMIT queue: the limits on this node (they are per node), in use, tokens."""
    name = _queue_name(args[0])
    return ok({"queue": text(name), **pairs(await call(w, b"QLIMIT", name))})


async def post_limits(w: NodeView, req: Request, args: list[str]) -> Response:
    """QLIMIT queue [ACTIVE n] [RATE n] [GROUP-ACTIVE n] | RESET [BCAST]: the node
    checks the values (-ERR: 400, nothing changed); the limits after it."""
    name = _queue_name(args[0])
    body = _json_body(req)
    cmd: list[Any] = [b"QLIMIT", name]
    if body.get("reset") is True:
        cmd.append(b"RESET")
    for key, word in _LIMIT_FIELDS:
        value = body.get(key)
        if value is None:
            continue
        if type(value) is not int:
            raise ApiError(400, f"{key} must be an integer")
        cmd += [word, value]
    if len(cmd) == 2:
        raise ApiError(400, "give active, rate, group_active or reset")
    if body.get("bcast") is True:
        cmd.append(b"BCAST")
    return ok({"queue": text(name), **pairs(await call(w, *cmd))})


async def post_requeue(w: NodeView, req: Request, args: list[str]) -> Response:
    """Every job of a dead-letter queue back to its queue with REDRIVE (same ID,
    TTL, RETRY and MAXDELIVER, delivery counters reset: a requeued poison job gets
    its n deliveries again, then comes back here), at most http-api-jobs-max per
    call; ``left`` says how many remain."""
    dead = _queue_name(args[0])
    body = _json_body(req)
    if not dead.startswith(DEAD_PREFIX.encode()) or len(dead) == len(DEAD_PREFIX):
        raise ApiError(400, f"not a dead-letter queue (names start with '{DEAD_PREFIX}')")
    await _qstat(w, dead)
    target = dead[len(DEAD_PREFIX):]
    if "id" in body:
        return await _requeue_one(w, dead, target, body["id"])
    moved = 0
    limit = w.cfg.http_api_jobs_max
    while moved < limit:
        try:  # each call moves at most redrive-count-max
            n = int(await call(w, b"REDRIVE", dead, b"COUNT", limit - moved))
        except ReplyError as e:  # the queue is paused in input: nothing of this call moved
            raise ApiError(409, f"requeued {moved}, then {target.decode('utf-8', 'replace')}: {e}") from None
        if not n:
            break
        moved += n
    left = await call(w, b"QLEN", dead)
    return ok({"from": text(dead), "to": text(target), "requeued": moved, "left": left})


async def _requeue_one(w: NodeView, dead: bytes, target: bytes, raw_id: Any) -> Response:
    """One dead letter back to its queue (REDRIVE dead:q ID job): 404 for a job
    that is not queued in ``dead``."""
    if not isinstance(raw_id, str) or not is_valid_job_id(raw_id.encode()):
        raise ApiError(400, "id must be a job ID")
    try:
        n = int(await call(w, b"REDRIVE", dead, b"ID", raw_id))
    except ReplyError as e:  # the queue is paused in input
        raise ApiError(409, f"{target.decode('utf-8', 'replace')}: {e}") from None
    if not n:
        raise ApiError(404, f"no job '{raw_id}' queued in {text(dead)}")
    return ok({"from": text(dead), "to": text(target), "requeued": 1, "id": raw_id,
               "left": await call(w, b"QLEN", dead)})


# ------------------------------------------------------------------ jobs


def _job_id(raw: str) -> bytes:
    job_id = urllib.parse.unquote_to_bytes(raw)
    if not is_valid_job_id(job_id):
        raise ApiError(400, "invalid job ID")
    return job_id


async def _show(w: NodeView, job_id: bytes) -> dict[str, Any]:
    return await _pairs_or_404(w, b"SHOW", job_id, "job")


async def get_job(w: NodeView, req: Request, args: list[str]) -> Response:
    """SHOW, and for an active job its ``kind`` (delivered, delayed, waiting)."""
    job = await _show(w, _job_id(args[0]))
    if job.get("state") == "active":
        job["kind"] = (await _job_kinds(w, [str(job["id"])])).get(str(job["id"]), "waiting")
    return ok(job)


async def _job_or_404(w: NodeView, cmd: bytes, job_id: bytes, done: str) -> Response:
    """``cmd job_id`` (DELJOB, ACKJOB): ``{"id": ..., done: 1}``, 404 when no job was known."""
    if not await call(w, cmd, job_id):
        raise ApiError(404, f"unknown job '{job_id.decode()}'")
    return ok({"id": job_id.decode(), done: 1})


async def delete_job(w: NodeView, req: Request, args: list[str]) -> Response:
    return await _job_or_404(w, b"DELJOB", _job_id(args[0]), "deleted")


async def post_ack(w: NodeView, req: Request, args: list[str]) -> Response:
    job_id = _job_id(args[0])
    _json_body(req)
    return await _job_or_404(w, b"ACKJOB", job_id, "acked")


async def _requeue_verb(w: NodeView, req: Request, args: list[str], cmd: bytes, done: str,
                        refused: str) -> Response:
    """``cmd job`` (NACK, ENQUEUE), which queues the job: ``{"id", done: 1, "job": SHOW}``;
    404 for an unknown job, 409 (``refused``) for one the command leaves as it is."""
    job_id = _job_id(args[0])
    _json_body(req)
    if not await call(w, cmd, job_id):
        job = await _show(w, job_id)  # 404 when unknown
        raise ApiError(409, f"job is {job['state']}: {refused}")
    return ok({"id": job_id.decode(), done: 1, "job": await _show(w, job_id)})


async def post_nack(w: NodeView, req: Request, args: list[str]) -> Response:
    return await _requeue_verb(w, req, args, b"NACK", "nacked", "only an active job can be NACKed")


async def post_enqueue(w: NodeView, req: Request, args: list[str]) -> Response:
    """ENQUEUE: "run now" for a job that waits (its DELAY, a NACK ... DELAY, a RETRY)."""
    return await _requeue_verb(w, req, args, b"ENQUEUE", "queued",
                               "only a job not queued yet can be queued now")


async def post_dead(w: NodeView, req: Request, args: list[str]) -> Response:
    """DEADLETTER: the job moves to ``dead:{queue}`` with its ID, counters and what is
    left of its TTL; ``{"reason": text}`` in the body is kept with it (SHOW's
    ``dead-reason``)."""
    job_id = _job_id(args[0])
    reason = _json_body(req).get("reason", dead_reason)
    if not isinstance(reason, str) or len(reason.encode()) > dead_reason_bytes_max:
        raise ApiError(400, f"reason must be a string of at most {dead_reason_bytes_max} bytes")
    job = await _show(w, job_id)
    queue = str(job["queue"])
    if queue.startswith(DEAD_PREFIX):
        raise ApiError(409, "the job is already in a dead-letter queue")
    if job["state"] not in ("queued", "active"):
        raise ApiError(409, f"job is {job['state']}: only a queued or active job can be moved")
    if not await call(w, b"DEADLETTER", job_id, b"REASON", reason.encode()):
        raise ApiError(409, "the job cannot be moved now (an at-most-once job already "
                            "delivered, or one still waiting for its copies)")
    return ok({"id": job_id.decode(), "moved_to": DEAD_PREFIX + queue, "new_id": job_id.decode()})


# ------------------------------------------------------------------ nodes


async def get_nodes(w: NodeView, req: Request, args: list[str]) -> Response:
    hello = await call(w, b"HELLO")
    priorities = {text(n[0]): int(n[3]) for n in hello[2:]}
    view: dict[str, Any] = w.agent.view if w.agent is not None else {}
    nodes = []
    for node_id, ip, port, flags, ping_ms, pong_ms, link in view.get("nodes") or []:
        nodes.append({"id": node_id, "ip": ip, "port": port, "flags": list(flags),
                      "myself": "myself" in flags, "link": bool(link), "ping_sent_ms": ping_ms,
                      "pong_received_ms": pong_ms, "priority": priorities.get(node_id)})
    if not nodes:
        nodes = [{"id": w.node_id, "ip": "", "port": w.cfg.port, "flags": ["myself"],
                  "myself": True, "link": True, "ping_sent_ms": 0, "pong_received_ms": 0,
                  "priority": priorities.get(w.node_id)}]
    return ok({"myid": text(hello[1]), "nodes": nodes})


# ------------------------------------------------------------------ schedules


async def get_schedules(w: NodeView, req: Request, args: list[str]) -> Response:
    """SCHEDULE LIST, then SHOW of each (a schedule deleted meanwhile is left out)."""
    out = []
    for name in await call(w, b"SCHEDULE", b"LIST"):
        try:
            show = pairs(await call(w, b"SCHEDULE", b"SHOW", name))
        except ReplyError:
            continue
        out.append(show)
    return ok({"schedules": out})


# ------------------------------------------------------------------ draining the node


async def _drain_progress(w: NodeView) -> drain.Progress:
    info = text(await call(w, b"INFO", b"jobs"))
    fields = dict(line.split(":", 1) for line in str(info).splitlines() if ":" in line)
    hello = await call(w, b"HELLO")
    leaving = text(await call(w, b"CLUSTER", b"LEAVING")) == "yes"
    return drain.progress(fields, text(hello[1]), [(text(n[0]), int(n[3])) for n in hello[2:]],
                          leaving)


async def _repl_max(w: NodeView) -> int:
    """The highest REPLICATE among the jobs a drain moves or waits for (JSCAN, bounded)."""
    cursor, top, seen = b"0", 0, 0
    states = [a for st in drain.REPL_CHECK_STATES for a in (b"STATE", st.encode())]
    while True:
        reply = await call(w, b"JSCAN", cursor, b"COUNT", drain.jscan_count, *states,
                           b"REPLY", b"all")
        cursor, items = reply[0], reply[1]
        top = max(top, drain.repl_of(pairs(item) for item in items))
        seen += len(items)
        if cursor == b"0" or seen >= drain.repl_check_jobs_max:
            return top


class Drainer:
    """This worker's drain in the background: wait for the jobs to move, then SHUTDOWN
    (``shutdown``), or past ``timeout_s`` log what is left and leave the node LEAVING."""

    task: asyncio.Task[None] | None = None

    @classmethod
    def running(cls) -> bool:
        return cls.task is not None and not cls.task.done()

    @classmethod
    def start(cls, w: NodeView, timeout_s: float, shutdown: bool) -> None:
        cls.task = w.loop.create_task(cls.run(w, timeout_s, shutdown))

    @classmethod
    async def run(cls, w: NodeView, timeout_s: float, shutdown: bool) -> None:
        try:
            await cls.wait_then_stop(w, timeout_s, shutdown)
        except ReplyError as e:  # a command refused on the way (the node said why)
            log.warning("drain stopped: %s; the node stays LEAVING", e)

    @staticmethod
    async def wait_then_stop(w: NodeView, timeout_s: float, shutdown: bool) -> None:
        deadline = w.loop.time() + timeout_s
        last = ""
        while True:
            p = await _drain_progress(w)
            if p.line() != last:
                last = p.line()
                log.info("drain: %s", last)
            if p.done:
                break
            if w.loop.time() >= deadline:
                log.warning("%s", drain.timeout_text(p, timeout_s))
                return
            await asyncio.sleep(drain.progress_interval_s)
        if shutdown:
            log.info("drain: no job left to move, shutting down")
            await call(w, b"SHUTDOWN")  # answers nothing: the supervisor stops every worker


async def get_drain(w: NodeView, req: Request, args: list[str]) -> Response:
    p = await _drain_progress(w)
    return ok({**p.as_dict(), "draining_here": Drainer.running()})


async def post_drain(w: NodeView, req: Request, args: list[str]) -> Response:
    """Start draining: refused with 409 (nothing changed) where a job would have no
    other node to hold it; else CLUSTER LEAVING yes and a background wait that
    SHUTDOWNs the node once no job is queued or waits for copies here."""
    body = _json_body(req)
    timeout_s = body.get("timeout_s", drain.drain_timeout_s_default)
    shutdown = body.get("shutdown", True)
    if type(timeout_s) not in (int, float) or not 0 <= timeout_s <= drain.drain_timeout_s_max:
        raise ApiError(400, f"timeout_s must be a number of seconds, 0 to "
                            f"{drain.drain_timeout_s_max:g}")
    if not isinstance(shutdown, bool):
        raise ApiError(400, "shutdown must be true or false")
    p = await _drain_progress(w)
    why = drain.refusal(p, await _repl_max(w) if p.left else 0)
    if why is not None:
        raise ApiError(409, why)
    await call(w, b"CLUSTER", b"LEAVING", b"yes")
    if not Drainer.running():
        Drainer.start(w, float(timeout_s), shutdown)
    p = await _drain_progress(w)
    return ok({**p.as_dict(), "draining_here": True, "timeout_s": timeout_s,
               "shutdown": shutdown})


# ------------------------------------------------------------------ routing


def _json_body(req: Request) -> dict[str, Any]:
    """A POST body: JSON object (or empty), sent as application/json."""
    ctype = req.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise ApiError(415, "POST wants Content-Type: application/json")
    if not req.body.strip():
        return {}
    try:
        value = orjson.loads(req.body)
    except orjson.JSONDecodeError:
        raise ApiError(400, "the body is not valid JSON") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the body must be a JSON object")
    return value


_SEG = r"([^/]+)"
# A job ID contains '/' (base64): taken whole, raw or percent-encoded
_JOB = r"(D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}|[^/]+)"
ROUTES: list[tuple[re.Pattern[str], dict[str, Handler]]] = [
    (re.compile(r"/(?:index\.html)?"), {"GET": get_index}),
    (re.compile(r"/static/([a-z]+\.[a-z]+)"), {"GET": get_static}),
    (re.compile(r"/metrics"), {"GET": get_metrics}),
    (re.compile(r"/healthz"), {"GET": health.get_healthz}),
    (re.compile(r"/readyz"), {"GET": health.get_readyz}),
    (re.compile(r"/api/overview"), {"GET": get_overview}),
    (re.compile(r"/api/queues"), {"GET": get_queues}),
    (re.compile(rf"/api/queues/{_SEG}"), {"GET": get_queue}),
    (re.compile(rf"/api/queues/{_SEG}/pause"), {"POST": post_pause}),
    (re.compile(rf"/api/queues/{_SEG}/resume"), {"POST": post_resume}),
    (re.compile(rf"/api/queues/{_SEG}/requeue"), {"POST": post_requeue}),
    (re.compile(rf"/api/queues/{_SEG}/limits"), {"GET": get_limits, "POST": post_limits}),
    (re.compile(rf"/api/jobs/{_JOB}"), {"GET": get_job, "DELETE": delete_job}),
    (re.compile(rf"/api/jobs/{_JOB}/ack"), {"POST": post_ack}),
    (re.compile(rf"/api/jobs/{_JOB}/nack"), {"POST": post_nack}),
    (re.compile(rf"/api/jobs/{_JOB}/enqueue"), {"POST": post_enqueue}),
    (re.compile(rf"/api/jobs/{_JOB}/dead"), {"POST": post_dead}),
    (re.compile(r"/api/nodes"), {"GET": get_nodes}),
    (re.compile(r"/api/schedules"), {"GET": get_schedules}),
    (re.compile(r"/api/drain"), {"GET": get_drain, "POST": post_drain}),
]


async def handle(w: NodeView, req: Request) -> Response:
    for pattern, methods in ROUTES:
        m = pattern.fullmatch(req.path)
        if m is None:
            continue
        method = "GET" if req.method == "HEAD" else req.method
        handler = methods.get(method)
        if handler is None:
            allow = ", ".join(sorted({*methods, "HEAD"} if "GET" in methods else methods))
            return error(405, f"method {req.method} not allowed here", {"Allow": allow})
        try:
            return await handler(w, req, list(m.groups()))
        except ApiError as e:
            return error(e.status, str(e))
        except ReplyError as e:
            return error(_status_of(str(e)), str(e))
    return error(404, f"no such path '{req.path}'")


def _status_of(reply_error: str) -> int:
    """A command's error reply as an HTTP status."""
    code = reply_error.split(" ", 1)[0]
    if code == "BADID":
        return 400
    if code in ("PAUSED", "MAXLEN", "LEAVING", "TOOLATE"):
        return 409
    if code in ("NOREPL", "OOM"):
        return 503
    return 400

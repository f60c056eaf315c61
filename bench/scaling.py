"""Does every core pay? Workers against one worker, one queue against C Disque, the model.

    python -m bench.scaling [--rounds 3] [--quick] [--json out.json]
    python -m bench.scaling --only cores [--workers 1 2 4 8 16] [--md out.md]

Three measurements, all with redis-benchmark and per-process CPU counters
(utime + stime from /proc/<pid>/stat, so a figure also says where the CPU went):

- many queues: ``-r 10000 ADDJOB q:__rand_int__ x 0`` then ``GETJOB NOHANG FROM
  q:__rand_int__`` on a 1-worker and a 2-worker node (both prefilled), -P 1 and
  -P 32, rounds interleaved; the ratio is 2 workers over 1 worker.
- one queue: ``ADDJOB q x 0`` and ``GETJOB NOHANG FROM q`` against the reference
  Disque (C, 1.0-rc1) built from its source tarball (``reference_tarball()``)
  into a temporary directory (cached there by the tarball's digest), rounds
  interleaved. Without the tarball or a C compiler this part is skipped and
  says why.
- roles: CPU per command of each role a worker plays, on a 2-worker node with
  connections pinned to one worker (``bench/xworker.py``): a command run where
  it arrived (local), the same command arriving at the other worker and
  forwarded (out + reply relayed), and executed for another worker. The model
  (``model()``) turns them into throughput against the workers count.

``--only cores`` needs neither network nor redis-benchmark: its own load generator
(``_generator``: raw sockets, pre-encoded pipelines of ADDJOB, hiredis for the replies)
runs on the cores the node's workers leave free, pinned there with
``os.sched_setaffinity``, worker i pinned to core i. For 1, 2, 4, 8 and 16 workers (up
to the machine's cores) it measures random queues and one queue per connection, with
node CPU per request, beside the model's figure for a core per worker (role costs
measured in the same run).

Every node and server runs on a free port and is stopped at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench import record
from bench.figures import pyplot, save_figure
from bench.redisq import children_of, redis_benchmark

REPO = Path(__file__).resolve().parent.parent
REFERENCE_NAME = "disque-0192ba7-src.tar.gz"
CLIENTS = 50  # redis-benchmark -c, as in the targets
REQUESTS = 200_000  # redis-benchmark -n, as in the targets
RANDOM_QUEUES = 10_000  # redis-benchmark -r: queue names q:000000000000 .. q:000000009999
ROUNDS = 3  # interleaved rounds per side; the median counts
reference_build_timeout_s = 600  # make -j2 takes 20-60 s on 2 loaded cores
start_timeout_s = 20.0
roles_seconds = 3.0  # per role round (pinned connections, pipelined ADDJOB)
roles_rounds = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ----- CPU counters ---------------------------------------------------------


def kernel_counts(pid: int) -> tuple[int, int]:
    """(read + write syscalls, context switches) of one process so far ((0, 0) once
    it is gone): the per-request cost of frames and wakeups that CPU time hides."""
    try:
        io = Path(f"/proc/{pid}/io").read_text()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0, 0
    calls = sum(int(line.split()[1]) for line in io.splitlines()
                if line.startswith(("syscr:", "syscw:")))
    switches = sum(int(line.split()[1]) for line in status.splitlines()
                   if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")))
    return calls, switches


def cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of one process, seconds ((0.0, 0.0) once it is gone): stime is
    the kernel's part (syscalls, wakeups, loopback copies)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0, 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_s(pid: int) -> float:
    """utime + stime of one process, seconds (0.0 once it is gone)."""
    user, kernel = cpu_split(pid)
    return user + kernel


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench_cpu(port: int, pids: list[int], *args: str, pipeline: int,
              requests: int = REQUESTS) -> dict[str, Any]:
    """One redis-benchmark run: req/s, CPU seconds of each server process and of
    redis-benchmark itself, and CPU microseconds per request (server, client)."""
    before = [cpu_s(p) for p in pids]
    client0 = children_cpu_s()
    wall0 = time.monotonic()
    row = redis_benchmark(port, *args, clients=CLIENTS, requests=requests, pipeline=pipeline)[0]
    wall = time.monotonic() - wall0
    client = children_cpu_s() - client0
    used = [cpu_s(p) - b for p, b in zip(pids, before, strict=True)]
    return {"rps": row["rps"], "p50_ms": row.get("p50_latency_ms"), "command": row["command"],
            "cpu_s": [round(u, 3) for u in used], "client_cpu_s": round(client, 3),
            "wall_s": round(wall, 3),
            "server_us_per_req": round(1e6 * sum(used) / requests, 3),
            "client_us_per_req": round(1e6 * client / requests, 3)}


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(rows, key=lambda r: r["rps"])[len(rows) // 2]


# ----- servers --------------------------------------------------------------


@contextmanager
def disque_mp_node(workdir: Path, workers: int) -> Iterator[tuple[int, list[int]]]:
    """A disque-mp node (compiled build if present) -> (port, worker pids)."""
    from tests.nodeproc import NodeProc

    node = NodeProc(workdir / f"node-w{workers}", workers=workers,
                    conf={"loglevel": "warning", "maxmemory": "8gb"}).start()
    try:
        assert node.proc is not None
        pids: list[int] = []
        deadline = time.monotonic() + start_timeout_s
        while len(pids) < workers and time.monotonic() < deadline:
            pids = children_of(node.proc.pid)
            time.sleep(0.05)
        yield node.port, pids
    finally:
        node.stop()


def reference_tarball() -> Path:
    """The reference's source tarball in the machine's shared directory next to the
    repository, or next to the main checkout when this one is a git worktree
    (``git rev-parse --git-common-dir``)."""
    roots = [REPO]
    try:
        common = subprocess.run(["git", "rev-parse", "--path-format=absolute", "--git-common-dir"],
                                cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        if common:
            roots.append(Path(common).parent)
    except (OSError, subprocess.SubprocessError):
        pass  # not a git checkout: only the repository's own parent
    for root in roots:
        path = root.parent / "shared" / "reference-src" / REFERENCE_NAME
        if path.exists():
            return path
    return REPO.parent / "shared" / "reference-src" / REFERENCE_NAME


def reference_binary() -> tuple[Path | None, str]:
    """Build (once per tarball digest, in the temp dir) the reference disque-server.
    Returns (binary, status); binary None means skipped, status says why."""
    tarball = reference_tarball()
    if not tarball.exists():
        return None, f"skipped: {tarball} is absent (no reference source on this machine)"
    if shutil.which("make") is None or (shutil.which("cc") is None and shutil.which("gcc") is None):
        return None, "skipped: no C compiler or make on this machine"
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / f"disque-mp-reference-{digest}"
    binary = root / "disque-0192ba7" / "src" / "disque-server"
    if binary.exists():
        return binary, f"built from {tarball.name} (cached in {root})"
    scratch = Path(tempfile.mkdtemp(prefix="disque-mp-reference-"))
    t0 = time.monotonic()
    try:
        subprocess.run(["tar", "xzf", str(tarball), "-C", str(scratch)], check=True,
                       capture_output=True, timeout=120)
        out = subprocess.run(["make", "-C", str(scratch / "disque-0192ba7"), "-j2", "CFLAGS=-fcommon"],
                             capture_output=True, text=True, timeout=reference_build_timeout_s)
    except (subprocess.SubprocessError, OSError) as e:
        shutil.rmtree(scratch, ignore_errors=True)
        return None, f"skipped: the reference did not build ({e})"
    if out.returncode != 0 or not (scratch / "disque-0192ba7" / "src" / "disque-server").exists():
        shutil.rmtree(scratch, ignore_errors=True)
        return None, f"skipped: the reference did not build: {out.stderr[-300:]!r}"
    try:
        scratch.rename(root)
    except OSError:  # another run built it meanwhile
        shutil.rmtree(scratch, ignore_errors=True)
    return binary, f"built from {tarball.name} in {time.monotonic() - t0:.0f} s ({root})"


@contextmanager
def reference_server(binary: Path, workdir: Path) -> Iterator[tuple[int, list[int]]]:
    """The reference disque-server on a free port -> (port, [pid])."""
    import redis

    from tests.nodeproc import free_port

    port = free_port()
    d = workdir / "reference"
    d.mkdir(parents=True, exist_ok=True)
    conf = d / "disque.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {d}\nappendonly no\nloglevel warning\n")
    proc = subprocess.Popen([str(binary), str(conf)], cwd=d, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                if redis.Redis(port=port, protocol=2, socket_timeout=2).ping():
                    break
            except redis.RedisError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the reference disque-server did not start") from None
                time.sleep(0.05)
        yield port, [proc.pid]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ----- the measurements -----------------------------------------------------


def with_medians_and_ratios(out: dict[str, Any], runs: dict[str, list[dict[str, Any]]],
                            num: str, den: str) -> dict[str, Any]:
    """``out`` with the ``runs``, each run key's median row, and for ADDJOB and GETJOB at
    -P 1 and -P 32 the ratio of side ``num``'s rate to side ``den``'s."""
    out["runs"] = runs
    for key, rows in runs.items():
        out[key] = median_row(rows)
    for cmd in ("addjob", "getjob"):
        for pipeline in (1, 32):
            top, bottom = out[f"{cmd}_p{pipeline}_{num}"], out[f"{cmd}_p{pipeline}_{den}"]
            out[f"{cmd}_p{pipeline}_ratio"] = top["rps"] / bottom["rps"]
    return out


def many_queues(workdir: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """1-worker vs 2-worker node over RANDOM_QUEUES random queues, interleaved rounds."""
    add = ("-r", str(RANDOM_QUEUES), "ADDJOB", "q:__rand_int__", "x", "0")
    get = ("-r", str(RANDOM_QUEUES), "GETJOB", "NOHANG", "FROM", "q:__rand_int__")
    runs: dict[str, list[dict[str, Any]]] = {}
    with disque_mp_node(workdir, 1) as (port1, pids1), disque_mp_node(workdir, 2) as (port2, pids2):
        sides = [("w1", port1, pids1), ("w2", port2, pids2)]
        for _, port, pids in sides:  # prefill: GETJOB rounds always find jobs
            bench_cpu(port, pids, *add, pipeline=32, requests=REQUESTS * rounds)
        for i in range(rounds):
            for pipeline in (1, 32):
                for side, port, pids in sides if i % 2 == 0 else sides[::-1]:
                    for cmd, args in (("addjob", add), ("getjob", get)):
                        key = f"{cmd}_p{pipeline}_{side}"
                        runs.setdefault(key, []).append(bench_cpu(port, pids, *args, pipeline=pipeline))
    return with_medians_and_ratios({"rounds": rounds}, runs, "w2", "w1")


def one_queue_vs_reference(workdir: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """One queue: a 2-worker node against the reference disque-server."""
    binary, status = reference_binary()
    out: dict[str, Any] = {"reference": status, "rounds": rounds}
    if binary is None:
        return out
    add = ("ADDJOB", "q", "x", "0")
    get = ("GETJOB", "NOHANG", "FROM", "q")
    runs: dict[str, list[dict[str, Any]]] = {}
    try:
        with disque_mp_node(workdir, 2) as (port, pids), reference_server(binary, workdir) as (rport, rpids):
            sides = [("disque_mp", port, pids), ("reference", rport, rpids)]
            for i in range(rounds):
                for pipeline in (1, 32):
                    for side, p, ps in sides if i % 2 == 0 else sides[::-1]:
                        for cmd, args in (("addjob", add), ("getjob", get)):
                            runs.setdefault(f"{cmd}_p{pipeline}_{side}", []).append(
                                bench_cpu(p, ps, *args, pipeline=pipeline))
    except RuntimeError as e:  # the reference would not start or a run failed: say so
        out["reference"] = f"{status}; the comparison failed: {str(e)[-300:]}"
        return out
    return with_medians_and_ratios(out, runs, "disque_mp", "reference")


def roles(workdir: Path, pipeline: int = 32) -> dict[str, Any]:
    """CPU microseconds per command of each role, from per-process counters on a
    2-worker node: connections pinned to worker A send pipelined ADDJOB either to a
    queue A owns (A: local) or alternating between a queue of A and one of B (A:
    half local, half forwarded out and relayed back; B: half executed for A)."""
    import uvloop

    from bench import xworker

    async def go(port: int, pids: list[int]) -> dict[str, Any]:
        qa = xworker.queue_of_owner(0, 2, "roles-a-")
        qb = xworker.queue_of_owner(1, 2, "roles-b-")
        owner = await xworker.where_queue_lives(port, qa, pids)
        a = owner if owner is not None else pids[0]
        b = pids[1] if a == pids[0] else pids[0]
        rows: dict[str, list[dict[str, float]]] = {"local": [], "mixed": []}
        for _ in range(roles_rounds):
            for label, queues in (("local", [qa]), ("mixed", [qa, qb])):
                conns = await xworker.pinned(port, a, pids, xworker.conns_wanted)
                try:
                    ca, cb, t0 = cpu_s(a), cpu_s(b), time.monotonic()
                    rate = await xworker.drive(conns, queues, pipeline, roles_seconds)
                    n = rate * (time.monotonic() - t0)
                    rows[label].append({"rps": rate, "a_us": 1e6 * (cpu_s(a) - ca) / n,
                                        "b_us": 1e6 * (cpu_s(b) - cb) / n})
                finally:
                    for c in conns:
                        c.close()
        med = {label: {k: statistics.median(r[k] for r in rs) for k in ("rps", "a_us", "b_us")}
               for label, rs in rows.items()}
        local_us = med["local"]["a_us"]
        # mixed, per command: A = 0.5 local + 0.5 (out + relay); B = 0.5 executed
        forward_us = 2 * med["mixed"]["a_us"] - local_us
        executed_us = 2 * med["mixed"]["b_us"]
        return {"pipeline": pipeline, "rounds": roles_rounds, "seconds": roles_seconds,
                "conns": xworker.conns_wanted,
                "rows": rows, "medians": med, "local_us": local_us,
                "forward_relay_us": forward_us, "executed_for_other_us": executed_us}

    with disque_mp_node(workdir, 2) as (port, pids):
        return uvloop.run(go(port, pids))


# ----- the model --------------------------------------------------------------


def node_us_per_req(workers: int, local_us: float, forward_relay_us: float, executed_us: float) -> float:
    """CPU of the whole node per request when queues are spread evenly and a client's
    connection lands on any worker: 1/N of the commands run where they arrive, the
    rest pay the hop on both sides."""
    if workers <= 1:
        return local_us
    remote = 1 - 1 / workers
    return (1 - remote) * local_us + remote * (forward_relay_us + executed_us)


def model(workers: int, cores: float, local_us: float, forward_relay_us: float, executed_us: float,
          client_us: float) -> float:
    """Requests/s of an N-worker node: each worker uses at most one core, and the
    node and the load generator together at most ``cores``."""
    node_us = node_us_per_req(workers, local_us, forward_relay_us, executed_us)
    per_worker_cap = workers * 1e6 / node_us
    machine_cap = cores * 1e6 / (node_us + client_us)
    return min(per_worker_cap, machine_cap)


def fit(many: dict[str, Any], role: dict[str, Any], pipeline: int = 32) -> dict[str, Any]:
    """The role costs (pinned connections) checked against the redis-benchmark runs
    of 1 and 2 workers: node CPU per request, and throughput on this machine with the
    CPU the node and redis-benchmark actually got there (other work shares it); then
    predicted for a host with a core per worker plus the client's."""
    local = role["local_us"]
    fwd = role["forward_relay_us"]
    exe = role["executed_for_other_us"]
    w1 = many[f"addjob_p{pipeline}_w1"]
    w2 = many[f"addjob_p{pipeline}_w2"]
    client_us = statistics.mean([w1["client_us_per_req"], w2["client_us_per_req"]])
    cores = os.cpu_count() or 2
    check = {}
    for n, row in ((1, w1), (2, w2)):
        # the cores this run really had: CPU used by node + client over its wall time
        got = (sum(row["cpu_s"]) + row["client_cpu_s"]) / max(row["wall_s"], 1e-9)
        check[n] = {"measured_rps": row["rps"], "cores_used": got,
                    "model_rps": model(n, min(got, cores), local, fwd, exe, client_us),
                    "measured_node_us": row["server_us_per_req"],
                    "model_node_us": node_us_per_req(n, local, fwd, exe)}
    predicted = {n: model(n, n + 1, local, fwd, exe, client_us) for n in (1, 2, 4, 8, 16)}
    return {"pipeline": pipeline, "local_us": local, "forward_relay_us": fwd,
            "executed_for_other_us": exe, "client_us": client_us, "cores_here": cores,
            "check": check, "predicted_rps": predicted,
            "speedup_2_here": check[2]["model_rps"] / check[1]["model_rps"],
            "node_us_ratio_measured": w2["server_us_per_req"] / w1["server_us_per_req"],
            "node_us_ratio_model": node_us_per_req(2, local, fwd, exe) / local,
            "speedup_16": predicted[16] / predicted[1]}


def plot_model(fitted: dict[str, Any], out: Path) -> Path:
    """Predicted req/s for 1..16 workers (a core each plus the client's), and the
    measured points of this machine (its cores shared with redis-benchmark and
    whatever else runs) beside the model's figure for the CPU they got."""
    plt = pyplot()
    ns = list(range(1, 17))
    a = (fitted["local_us"], fitted["forward_relay_us"], fitted["executed_for_other_us"],
         fitted["client_us"])
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(ns, [model(n, n + 1, *a[:3], a[3]) for n in ns], "-", color="C0",
            label="model: a core per worker (+1 for the client)")
    ax.plot(ns, [n * 1e6 / a[0] for n in ns], ":", color="C2",
            label="no hop (clients routed to the owner)")
    for n, c in fitted["check"].items():
        first = int(n) == 1
        ax.plot([int(n)], [c["measured_rps"]], "o", color="C3",
                label=f"measured here ({fitted['cores_here']} shared cores)" if first else None)
        ax.plot([int(n)], [c["model_rps"]], "x", color="C1",
                label="model with the CPU those runs got" if first else None)
    ax.set_xlabel("workers")
    ax.set_ylabel(f"ADDJOB/s, 10,000 random queues, -P {fitted['pipeline']}")
    ax.set_title("throughput against workers: model and measurements")
    ax.set_xticks([1, 2, 4, 8, 16])
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out)


# ----- cores: 1..16 workers, its own pinned load generator --------------------

CORES_WORKERS = (1, 2, 4, 8, 16)
cores_seconds = 3.0  # each (workers, shape) run; ADDJOBs pile up: ~0.5 KB each
cores_conns = 64  # connections over all generator processes
cores_pipeline = 32
CORES_SHAPES = ("random", "per-connection")


def _batches(shape: str, conn: int, rng: random.Random, pipeline: int) -> list[bytes]:
    """Pre-encoded pipelines of ADDJOB: random queues (of RANDOM_QUEUES) or the
    connection's own queue."""
    def cmd(q: str) -> bytes:
        return b"*4\r\n$6\r\nADDJOB\r\n$%d\r\n%s\r\n$1\r\nx\r\n$1\r\n0\r\n" % (len(q), q.encode())
    if shape == "per-connection":
        return [cmd(f"c:{conn}") * pipeline]
    return [b"".join(cmd(f"q:{rng.randrange(RANDOM_QUEUES)}") for _ in range(pipeline))
            for _ in range(16)]


def _generator(port: int, cpus: list[int], conns: list[int], shape: str, seconds: float,
               pipeline: int, out: Any) -> None:
    """One load process, pinned to ``cpus``: every connection keeps ``pipeline``
    ADDJOBs in flight (send a batch on each, then read each one's replies)."""
    import socket

    import hiredis

    os.sched_setaffinity(0, cpus)
    rng = random.Random(conns[0])
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in conns]
    readers = [hiredis.Reader() for _ in conns]
    batches = [_batches(shape, c, rng, pipeline) for c in conns]
    done, k = 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for s, b in zip(socks, batches, strict=True):
            s.sendall(b[k % len(b)])
        for s, r in zip(socks, readers, strict=True):
            got = 0
            while got < pipeline:
                reply = r.gets()
                if reply is False:
                    r.feed(s.recv(65536))
                    continue
                got += 1
        done += pipeline * len(socks)
        k += 1
    for s in socks:
        s.close()
    out.put(done)


def cores_run(port: int, pids: list[int], workers: int, shape: str,
              seconds: float = cores_seconds) -> dict[str, Any]:
    """Pin worker i to core i, the generator to the cores left (all of them, shared,
    when none is left); req/s and node CPU per request."""
    import multiprocessing

    total = os.cpu_count() or 1
    pinned = total > workers
    if pinned:
        for i, pid in enumerate(sorted(pids)):
            os.sched_setaffinity(pid, [i])
    gen_cpus = list(range(workers, total)) if pinned else list(range(total))
    procs_n = max(1, min(len(gen_cpus), cores_conns))
    ctx = multiprocessing.get_context("fork")
    out: Any = ctx.Queue()
    conns = list(range(cores_conns))
    procs = [ctx.Process(target=_generator, args=(port, [gen_cpus[j]] if pinned else gen_cpus,
                                                  conns[j::procs_n], shape, seconds,
                                                  cores_pipeline, out))
             for j in range(procs_n)]
    before = [cpu_split(p) for p in pids]
    kbefore = [kernel_counts(p) for p in pids]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    done = sum(out.get(timeout=seconds + 120) for _ in procs)
    wall = time.monotonic() - t0
    for p in procs:
        p.join(30)
    after = [cpu_split(p) for p in pids]
    used = sum(sum(a) - sum(b) for a, b in zip(after, before, strict=True))
    kernel = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    kafter = [kernel_counts(p) for p in pids]
    calls = sum(a[0] - b[0] for a, b in zip(kafter, kbefore, strict=True))
    switches = sum(a[1] - b[1] for a, b in zip(kafter, kbefore, strict=True))
    return {"workers": workers, "shape": shape, "rps": done / wall, "requests": done,
            "node_us_per_req": 1e6 * used / max(done, 1), "pinned": pinned,
            "node_kernel_share": kernel / used if used > 0 else 0.0,
            "syscalls_per_req": calls / max(done, 1), "switches_per_req": switches / max(done, 1),
            "generator_cpus": gen_cpus, "generator_procs": procs_n}


def cores_counts(workers_list: tuple[int, ...], cpus: int, beyond: bool) -> list[int]:
    """The workers counts a cores run measures: up to the machine's cores (2 at least),
    or every one asked with ``beyond``."""
    return [n for n in workers_list if beyond or n <= max(cpus, 2)]


def cores(workers_list: tuple[int, ...] = CORES_WORKERS, rounds: int = ROUNDS,
          beyond: bool = False) -> dict[str, Any]:
    """Every workers count up to the machine's cores (pinned while the generator has a
    core left, shared beyond), both shapes, median of ``rounds``. ``beyond``: the
    counts over the cores too (more workers than cores: node CPU per request is the
    figure there, not req/s)."""
    total = os.cpu_count() or 1
    counts = cores_counts(workers_list, total, beyond)
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="disque-mp-cores-") as tmp:
        for n in counts:
            with disque_mp_node(Path(tmp), n) as (port, pids):
                for r in range(rounds):
                    for shape in CORES_SHAPES if r % 2 == 0 else CORES_SHAPES[::-1]:
                        rows.setdefault(f"{shape}_w{n}", []).append(cores_run(port, pids, n, shape))
    med = {k: median_row(v) for k, v in rows.items()}
    for row in med.values():
        base = med.get(f"{row['shape']}_w1")
        row["speedup_vs_1"] = row["rps"] / base["rps"] if base else None
    return {"cpus": total, "cpu_model": _cpu_model(), "workers": counts, "rounds": rounds,
            "seconds": cores_seconds, "conns": cores_conns, "pipeline": cores_pipeline,
            "medians": med, "runs": rows}


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def cores_model(role: dict[str, Any], counts: list[int]) -> dict[str, dict[int, float]]:
    """The model's req/s with a core per worker (the generator on cores of its own):
    random queues pay the hop on (N-1)/N of the commands, a connection per queue none
    (the handoff moves it to the owner)."""
    local, fwd, exe = role["local_us"], role["forward_relay_us"], role["executed_for_other_us"]
    return {"random": {n: n * 1e6 / node_us_per_req(n, local, fwd, exe) for n in counts},
            "per-connection": {n: n * 1e6 / local for n in counts}}


def cores_markdown(res: dict[str, Any], predicted: dict[str, dict[int, float]] | None) -> str:
    lines = [f"# Workers against cores: {res['cpus']} CPUs ({res['cpu_model']})", "",
             f"`python -m bench.scaling --only cores`: ADDJOB, {res['conns']} connections, "
             f"-P {res['pipeline']}, {res['seconds']:g} s per run, median of {res['rounds']}; "
             "worker i pinned to core i, the load generator to the cores left (\"shared\": "
             "none left, everything on every core). 1-minute load average at the end: "
             f"{os.getloadavg()[0]:.2f}. {record.provenance_line()}", "",
             "| workers | traffic | req/s | node us/req | vs 1 worker | cores | model, a core each "
             "| node read+write syscalls/req | node context switches/req | node CPU in the kernel |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n in res["workers"]:
        for shape in CORES_SHAPES:
            row = res["medians"].get(f"{shape}_w{n}")
            if row is None:
                continue
            sp = row["speedup_vs_1"]
            model_rps = predicted[shape].get(n) if predicted else None
            lines.append(f"| {n} | {shape} | {row['rps']:,.0f} | {row['node_us_per_req']:.2f} | "
                         f"{'' if sp is None else f'{sp:.2f}x'} | "
                         f"{'pinned' if row['pinned'] else 'shared'} | "
                         f"{'' if model_rps is None else f'{model_rps:,.0f}'} | "
                         f"{row.get('syscalls_per_req', 0):.3f} | {row.get('switches_per_req', 0):.3f} | "
                         f"{100 * row.get('node_kernel_share', 0):.0f} % |")
    return "\n".join(lines) + "\n"


def run(rounds: int = ROUNDS, quick: bool = False) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="disque-mp-scaling-") as tmp:
        work = Path(tmp)
        many = many_queues(work, rounds)
        one = one_queue_vs_reference(work, rounds)
        role = roles(work)
    fitted = fit(many, role)
    return {"many_queues": many, "one_queue": one, "roles": role, "model": fitted,
            "loadavg_1m_end": round(os.getloadavg()[0], 2), "quick": quick}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling")
    p.add_argument("--rounds", type=int, default=ROUNDS)
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--only", choices=["many", "one", "roles", "cores"])
    p.add_argument("--workers", type=int, nargs="+", default=list(CORES_WORKERS),
                   help="--only cores: the workers counts (default 1 2 4 8 16)")
    p.add_argument("--md", type=Path, help="--only cores: write the markdown table here")
    p.add_argument("--beyond-cores", action="store_true",
                   help="--only cores: also run the workers counts above the machine's cores")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="disque-mp-scaling-") as tmp:
        work = Path(tmp)
        if a.only == "many":
            res: dict[str, Any] = many_queues(work, a.rounds)
        elif a.only == "one":
            res = one_queue_vs_reference(work, a.rounds)
        elif a.only == "roles":
            res = roles(work)
        elif a.only == "cores":
            res = cores(tuple(a.workers), a.rounds, a.beyond_cores)
            res["roles"] = roles(work)
            res["model"] = cores_model(res["roles"], res["workers"])
        else:
            res = run(a.rounds)
    text = json.dumps(res, indent=1, default=str)
    if a.only == "cores" and a.md:
        a.md.write_text(cores_markdown(res, res["model"]))
    if a.json:
        a.json.write_text(text + "\n")
    print(summary_lines(res) if a.only is None else text)
    return 0


def summary_lines(res: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in res.get("model", {}).items()}, indent=1, default=str)


if __name__ == "__main__":
    raise SystemExit(main())

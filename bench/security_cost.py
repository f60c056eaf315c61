"""What the cluster secret and TLS cost (docs/security.md has the figures).

    python -m bench.security_cost secret [--rounds 5] [--requests 20000] [--workers 2] [--clients 32]
    python -m bench.security_cost tls [--rounds 3] [--requests 200000]

``secret``: two 3-node clusters run side by side, one with ``cluster-secret-file``
(mutual authentication and a MAC on every bus frame) and one without;
``redis-benchmark -c CLIENTS ADDJOB q x 0 REPLICATE 3`` against the first node of
each, interleaved round by round (the machine is shared and noisy: compare the
pairs, not single runs). Prints jobs/s per round and the median ratio.

``tls``: ``redis-benchmark --tls -P 32 -c 50`` ADDJOB on a node's ``tls-port``
against LPUSH on ``redis-server --tls-port``, same certificates, interleaved.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.node.test_tls import make_pki
from tests.nodeproc import NodeProc, form_cluster, free_port, port_free


def bench(port: int, requests: int, clients: int, pipeline: int, *command: str,
          tls: list[str] | None = None) -> float:
    args = ["redis-benchmark", "-p", str(port), "-c", str(clients), "-n", str(requests),
            "-P", str(pipeline), "-q", *(tls or []), *command]
    out = subprocess.run(args, capture_output=True, timeout=600, check=True).stdout.decode()
    m = re.search(r"([\d.]+) requests per second", out.replace(",", ""))
    if m is None:
        raise RuntimeError(f"no figure in redis-benchmark's output: {out!r}")
    return float(m.group(1))


def secret_cost(rounds: int, requests: int, workers: int, clients: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dq-secret-"))
    (tmp / "secret").write_text("bench secret of the cluster, long enough\n")
    clusters: dict[str, list[NodeProc]] = {}
    try:
        for name, conf in (("secret", {"cluster-secret-file": str(tmp / "secret")}),
                           ("open", {})):
            nodes = [NodeProc(tmp / f"{name}{i}", workers=workers,
                              conf={**conf, "cluster-node-timeout": 5000}) for i in range(3)]
            for n in nodes:
                n.start()
            form_cluster(nodes, 60)
            clusters[name] = nodes
        figures: dict[str, list[float]] = {"secret": [], "open": []}
        for r in range(rounds):
            for name in (("secret", "open") if r % 2 == 0 else ("open", "secret")):
                port = clusters[name][0].port
                jobs = bench(port, requests, clients, 1, "ADDJOB", f"q{r}", "x", "0",
                             "REPLICATE", "3")
                figures[name].append(jobs)
                print(f"round {r} {name:6}: {jobs:10.0f} ADDJOB REPLICATE 3 /s", flush=True)
                subprocess.run(["redis-cli", "-p", str(port), "DEBUG", "FLUSHALL"],
                               capture_output=True, timeout=60, check=False)
        ratios = [s / o for s, o in zip(figures["secret"], figures["open"], strict=True)]
        print(f"median secret {statistics.median(figures['secret']):.0f}/s, open "
              f"{statistics.median(figures['open']):.0f}/s, per-round ratio median "
              f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    finally:
        for nodes in clusters.values():
            for n in nodes:
                n.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def tls_cost(rounds: int, requests: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="dq-tls-"))
    pki = make_pki(tmp / "pki")
    files = ["--cacert", pki["ca.crt"], "--cert", pki["client.crt"], "--key", pki["client.key"]]
    tls_port, redis_port = free_port(), free_port()
    node = NodeProc(tmp / "node", workers=2, conf={
        "tls-port": tls_port, "tls-cert-file": pki["node.crt"], "tls-key-file": pki["node.key"],
        "tls-ca-cert-file": pki["ca.crt"]})
    redis = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(redis_port), "--tls-cert-file",
         pki["node.crt"], "--tls-key-file", pki["node.key"], "--tls-ca-cert-file", pki["ca.crt"],
         "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL, cwd=tmp)
    try:
        node.start()
        deadline = time.monotonic() + 20
        while port_free(redis_port) and time.monotonic() < deadline:
            time.sleep(0.1)
        figures: dict[str, list[float]] = {"disque-mp ADDJOB": [], "redis LPUSH": [],
                                           "plain ADDJOB": []}
        for r in range(rounds):
            a = bench(tls_port, requests, 50, 32, "ADDJOB", "q", "x", "0", tls=["--tls", *files])
            b = bench(redis_port, requests, 50, 32, "LPUSH", "q", "x", tls=["--tls", *files])
            c = bench(node.port, requests, 50, 32, "ADDJOB", "q", "x", "0")
            figures["disque-mp ADDJOB"].append(a)
            figures["redis LPUSH"].append(b)
            figures["plain ADDJOB"].append(c)
            print(f"round {r}: ADDJOB over TLS {a:10.0f}/s, LPUSH over TLS {b:10.0f}/s, "
                  f"ratio {a / b:.2f}; ADDJOB on the plain port {c:10.0f}/s", flush=True)
            subprocess.run(["redis-cli", "-p", str(node.port), "DEBUG", "FLUSHALL"],
                           capture_output=True, timeout=60, check=False)
        a_med = statistics.median(figures["disque-mp ADDJOB"])
        b_med = statistics.median(figures["redis LPUSH"])
        c_med = statistics.median(figures["plain ADDJOB"])
        print(f"median: ADDJOB {a_med:.0f}/s, LPUSH {b_med:.0f}/s, ratio {a_med / b_med:.2f}; "
              f"plain ADDJOB {c_med:.0f}/s")
    finally:
        node.stop()
        redis.terminate()
        redis.wait(20)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("what", choices=("secret", "tls"))
    p.add_argument("--rounds", type=int, default=0)
    p.add_argument("--requests", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--clients", type=int, default=32)
    a = p.parse_args(argv)
    if a.what == "secret":
        secret_cost(a.rounds or 5, a.requests or 20000, a.workers, a.clients)
    else:
        tls_cost(a.rounds or 3, a.requests or 200000)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fair tenants: one tenant's backlog does not hold back another's jobs.

    make run                                   # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/fair_tenants.py [--nodes 127.0.0.1:7711]
"""

from __future__ import annotations

import argparse
import uuid

from disque_mp.client import Disque


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="127.0.0.1:7711")
    args = ap.parse_args()
    queue = f"reports-{uuid.uuid4().hex[:6]}"

    with Disque(args.nodes) as d:
        # A big customer queues a backlog, then a small one adds three jobs.
        d.add_jobs(((queue, f"big report #{i}") for i in range(1000)), group="acme")
        d.add_jobs(((queue, f"small report #{i}") for i in range(3)), group="tiny-co")
        print("QGROUPS:", d.qgroups(queue))  # [('acme', 1000), ('tiny-co', 3)]
        print("QSTAT groups:", d.qstat(queue)["groups"])  # type: ignore[index]

        # GETJOB serves the groups in rotation: tiny-co's jobs come out among the
        # first six, not after acme's thousand.
        jobs = d.get_jobs(queue, count=6, nohang=True)
        for job in jobs:
            print(" ", job.body.decode())
        d.ack(jobs)
        d.del_queue(queue)


if __name__ == "__main__":
    main()

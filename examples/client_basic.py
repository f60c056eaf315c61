"""The Python client in two minutes: produce, consume with the helper, inspect.

    make run                                   # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/client_basic.py [--nodes 127.0.0.1:7711]
"""

from __future__ import annotations

import argparse
import threading
import time

from disque_mp.client import Disque, Job, PausedError


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="127.0.0.1:7711")
    args = ap.parse_args()

    with Disque(args.nodes) as d:
        hello = d.hello()
        print(f"connected to node {hello.node_id[:8]} at {d.address}; cluster: "
              + ", ".join(f"{n.address} (priority {n.priority})" for n in hello.nodes))

        # Produce: RETRY 5 s means a job not acknowledged within 5 s is delivered again.
        ids = d.add_jobs((("emails", f"mail #{i}") for i in range(5)), retry=5)
        print(f"added {len(ids)} jobs; QLEN emails = {d.qlen('emails')}")
        print("SHOW first job:", {k: v for k, v in d.show(ids[0]).items()  # type: ignore[union-attr]
                                  if k in ("state", "retry", "ttl", "body")})

        # Consume: the helper ACKs when the handler returns, NACKs when it raises,
        # and sends WORKING while a slow handler runs past the retry time.
        attempts: dict[str, int] = {}
        stop = threading.Event()

        def handler(job: Job) -> None:
            attempts[job.id] = attempts.get(job.id, 0) + 1
            if job.body == b"mail #2" and job.nacks == 0:
                raise RuntimeError("SMTP hiccup")  # NACKed: comes back at once with nacks=1
            if job.body == b"mail #4":
                time.sleep(6)  # longer than RETRY: WORKING keeps it from being redelivered
            print(f"  sent {job.body.decode()} (nacks={job.nacks}, "
                  f"additional deliveries={job.additional_deliveries})")
            if len(attempts) == 5 and sum(attempts.values()) == 6:
                stop.set()

        handled = d.consume("emails", handler, stop=stop, poll_ms=200)
        print(f"handled {handled} deliveries; QLEN emails = {d.qlen('emails')}")

        # Errors are typed.
        d.pause("emails", "in")
        try:
            d.add_job("emails", "refused")
        except PausedError as exc:
            print(f"paused queue refuses jobs: {exc}")
        d.pause("emails", "none")


if __name__ == "__main__":
    main()

"""The asyncio client: produce, consume with the helper, close with ``aclose()``.

    make run                                    # a node on 127.0.0.1:7711 (other terminal)
    .venv/bin/python examples/async_client.py [--nodes 127.0.0.1:7711]
"""

from __future__ import annotations

import argparse
import asyncio

from disque_mp.aclient import AsyncDisque
from disque_mp.client import Job


async def run(nodes: str) -> None:
    d = AsyncDisque(nodes)
    try:
        hello = await d.hello()
        print(f"connected to node {hello.node_id[:8]}; {len(hello.nodes)} node(s) in the cluster")

        # Produce: RETRY 10 s, so a job not acknowledged in 10 s is delivered again.
        ids = await d.add_jobs((("thumbnails", f"image-{i}.png") for i in range(5)), retry=10)
        print(f"added {len(ids)} jobs; QLEN thumbnails = {await d.qlen('thumbnails')}")

        # Consume: the helper ACKs when the coroutine returns, NACKs when it raises,
        # and sends WORKING while it runs past half the RETRY time.
        async def handler(job: Job) -> None:
            await asyncio.sleep(0.05)  # the work
            print(f"  resized {job.body.decode()} (job {job.id})")

        handled = await d.consume("thumbnails", handler, count=5, max_jobs=len(ids))
        print(f"handled {handled}; QLEN thumbnails = {await d.qlen('thumbnails')}")

        # Or one at a time, without the helper:
        job_id = await d.add_job("thumbnails", "image-last.png", retry=10)
        job = await d.get_job("thumbnails", timeout_ms=1000)
        assert job is not None and job.id == job_id
        await d.ack(job)
        print("added, got and acknowledged", job.id)
    finally:
        await d.aclose()  # closes every connection (there is no close() on the async client)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="127.0.0.1:7711")
    asyncio.run(run(ap.parse_args().nodes))


if __name__ == "__main__":
    main()

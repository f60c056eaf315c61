"""The cluster agent says when it could not put a job message anywhere: the worker
then puts a YOURJOBS' jobs back in their queue (workers/federation.py,
``yourjobs_unsent``) instead of losing them with the message."""

from __future__ import annotations

from pathlib import Path

import pytest
import uvloop

from tests.bus.test_cluster_bus import AgentHost, until

pytestmark = pytest.mark.integration  # real sockets, as the agent tests it borrows from

nobody = "f" * 40  # a node ID no host knows


def test_send_reports_a_message_it_could_not_write(tmp_path: Path) -> None:
    uvloop.run(_scenario(tmp_path))


async def _scenario(tmp: Path) -> None:
    a = AgentHost(tmp, "a")
    await a.start()
    a0, a1 = a.agents
    try:
        await until(lambda: a1.to_owner is not None, "worker 1 linked to worker 0")
        # Worker 0 owns the bus: no link to that node, nothing written.
        assert a0.send(nobody, "YOURJOBS", 0, {}, [b"rec"]) is False
        # Worker 1 has no data link to it: worker 0 relays (and may drop it there).
        assert a1.send(nobody, "YOURJOBS", 1, {}, [b"rec"]) is True
        a.agents.remove(a0)  # closed here, not again below
        await a0.close()
        await until(lambda: a1.to_owner is None, "worker 1 lost its link to worker 0")
        assert a1.send(nobody, "YOURJOBS", 1, {}, [b"rec"]) is False
    finally:
        await a.close()

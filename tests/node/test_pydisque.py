"""pydisque (an existing Disque client from PyPI) against a real 2-worker node, with
redis-py 8 underneath (our venv, HELLO 3 handshake) and with redis-py 5 (the
Makefile's .venv-redis5, run as a subprocess since both cannot share a venv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.nodeproc import REPO, NodeProc

pytestmark = pytest.mark.integration

VENV5_PYTHON = REPO / ".venv-redis5" / "bin" / "python"

SCRIPT = r'''
import sys
import redis
from pydisque.client import Client

port = int(sys.argv[1])
c = Client([f"127.0.0.1:{port}"])
c.connect()
assert c.hello()[1] == c.connected_node.node_id

ids = [c.add_job(f"pyq{i % 3}", f"job{i}", timeout=100) for i in range(9)]
ids = [i.decode() if isinstance(i, bytes) else i for i in ids]
assert all(i.startswith("D-") for i in ids), ids
assert c.qlen("pyq0") == 3
peek = c.qpeek("pyq1", 2)
assert [p[2] for p in peek] == [b"job1", b"job4"], peek
stat = c.qstat("pyq2", return_dict=True)
assert stat[b"len"] == 3 and stat[b"name"] == b"pyq2", stat

jobs = c.get_job(["pyq0", "pyq1"], count=4)
assert len(jobs) == 4, jobs
queue, job_id, body = jobs[0]
assert queue == b"pyq0" and body == b"job0", jobs[0]
show = c.show(job_id, return_dict=True)
assert show[b"state"] == b"active", show
c.nack_job(job_id)  # pydisque returns nothing for ACK/NACK
assert c.show(job_id, return_dict=True)[b"nacks"] == 1
again = c.get_job(["pyq0"], withcounters=True)
assert again[0][1] == job_id and again[0][3] == 1, again
c.ack_job(*[j[1] for j in jobs])
assert c.show(job_id) is None

cursor, queues = c.qscan(count=100)
assert {b"pyq0", b"pyq1", b"pyq2"} <= set(queues), queues
cursor, found = c.jscan(busyloop=True)
assert cursor == 0 or cursor == b"0", cursor
assert set(f.decode() if isinstance(f, bytes) else f for f in found) == set(ids) - {j[1].decode() for j in jobs}, found
assert c.del_job(ids[2]) == 1
assert c.get_job(["nothing-here"], nohang=True) in ([], None)
print("pydisque ok", redis.__version__)
'''


def _run(python: Path | str, port: int) -> str:
    out = subprocess.run([str(python), "-c", SCRIPT, str(port)], capture_output=True, text=True,
                         timeout=120, cwd="/")
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.fixture
def node_py(tmp_path: Path) -> NodeProc:
    with NodeProc(tmp_path / "py", workers=2) as n:
        yield n


def test_pydisque_redis8(node_py: NodeProc) -> None:
    assert "pydisque ok 8." in _run(sys.executable, node_py.port)


@pytest.mark.skipif(not VENV5_PYTHON.exists(), reason="make .venv-redis5/.installed builds it")
def test_pydisque_redis5(node_py: NodeProc) -> None:
    assert "pydisque ok 5." in _run(VENV5_PYTHON, node_py.port)

"""Bounds on every input, on a real node: an argument past its named maximum gets
a clear error, the connection and the node keep serving, and nothing accepted
is lost (README "Limits")."""

from __future__ import annotations

import random
import socket
import time
from pathlib import Path

import pytest

from bus import frames
from disque_mp.node.config import Config
from tests.nodeproc import NodeProc, wait_until
from tests.rawclient import Err, RawClient, encode_command
from workers.job import delay_max_s, retry_max_s, ttl_max_s

# the longest queue name a client may use (queue-name-bytes-max: room for dead:<name>)
queue_name_bytes_max = Config().queue_name_bytes_max

pytestmark = pytest.mark.integration

INT64_MAX = 9223372036854775807


def test_addjob_times_past_their_maxima_are_refused_and_every_job_encodes(tmp_path: Path) -> None:
    conf = {"appendonly": "yes", "appendfsync": "always"}
    with NodeProc(tmp_path / "n", workers=2, conf=conf) as n:
        c = RawClient(n.port)
        cases = [
            (["RETRY", INT64_MAX, "TTL", 10], f"ERR RETRY time must be at most {retry_max_s} seconds"),
            (["TTL", INT64_MAX], f"ERR TTL must be at most {ttl_max_s} seconds"),
            (["TTL", ttl_max_s + 1], f"ERR TTL must be at most {ttl_max_s} seconds"),
            (["DELAY", INT64_MAX], f"ERR DELAY time must be at most {delay_max_s} seconds"),
            (["RETRY", retry_max_s + 1], f"ERR RETRY time must be at most {retry_max_s} seconds"),
        ]
        for opts, error in cases:
            reply = c.call("ADDJOB", "bq", "body", 0, *opts)
            assert reply == Err(error), (opts, reply)
            assert c.call("PING") == "PONG"  # the connection is unharmed
        assert c.call("QLEN", "bq") == 0  # nothing half-accepted stays in memory
        long_name = b"q" * (queue_name_bytes_max + 1)
        reply = c.call("ADDJOB", long_name, "body", 0)
        assert reply == Err(f"ERR queue name too long (at most {queue_name_bytes_max} bytes)")
        assert c.call("QLEN", long_name) == 0
        # The largest values accepted are written to the AOF and come back at restart.
        kept = [
            c.call("ADDJOB", "bq", "a", 0, "RETRY", retry_max_s, "TTL", ttl_max_s),
            c.call("ADDJOB", "bq", "b", 0, "DELAY", delay_max_s - 1, "TTL", ttl_max_s),
            c.call("ADDJOB", b"q" * queue_name_bytes_max, "c", 0),
        ]
        assert all(isinstance(j, str) and j.startswith("D-") for j in kept), kept
        c.close()
        n.stop()
        n.start()
        c = RawClient(n.port)
        for job_id in kept:
            show = c.call("SHOW", job_id)
            assert isinstance(show, list) and show[1] == job_id.encode(), show
        assert "Traceback" not in n.log_text()
        assert "struct.error" not in n.log_text()
        c.close()


def _scan_all(c: RawClient, *args: object) -> tuple[list[bytes], int]:
    cursor, found, calls = b"0", [], 0
    for _ in range(10_000):  # bounded: the node holds a few hundred items
        cursor, items = c.call(*args[:1], cursor, *args[1:])
        calls += 1
        found += items
        if cursor == b"0":
            return found, calls
    raise AssertionError("the scan never came back to cursor 0")


def test_counts_are_bounded_and_scans_continue_by_cursor(tmp_path: Path) -> None:
    with NodeProc(tmp_path / "n", workers=2) as n:
        c = RawClient(n.port)
        for name in ("getjob-count-max", "qpeek-count-max", "scan-count-max"):
            assert c.call("CONFIG", "SET", name, "5") == "OK"
            assert c.call("CONFIG", "GET", name) == [name.encode(), b"5"]
        assert c.call("CONFIG", "SET", "scan-count-max", "0") == Err(
            "ERR Invalid argument '0' for CONFIG SET 'scan-count-max'")
        queues = [f"bq{i}" for i in range(12)]  # on both workers
        ids = {str(c.call("ADDJOB", q, f"j{k}", 0)) for q in queues for k in range(20)}
        assert len(c.call("QPEEK", "bq0", 1_000_000)) == 5
        assert len(c.call("QPEEK", "bq0", -1_000_000)) == 5
        assert len(c.call("GETJOB", "NOHANG", "COUNT", 1_000_000, "FROM", "bq0")) == 5
        # several queues: the bound holds across the owners the coordinator asks
        got = c.call("GETJOB", "NOHANG", "COUNT", 9_223_372_036_854_775_807, "FROM", *queues)
        assert len(got) == 5
        for _, job_id, _ in c.call("GETJOB", "NOHANG", "COUNT", 3, "FROM", "bq1") + got:
            c.call("ENQUEUE", job_id)
        qs, calls = _scan_all(c, "QSCAN", "COUNT", 1_000_000)
        assert sorted(q.decode() for q in qs) == sorted(queues) and calls >= 2
        qs, calls = _scan_all(c, "QSCAN", "BUSYLOOP")
        assert sorted(q.decode() for q in qs) == sorted(queues) and calls >= 2
        js, calls = _scan_all(c, "JSCAN", "COUNT", 1_000_000)
        assert {str(j) for j in js} == ids and calls >= 2
        js, calls = _scan_all(c, "JSCAN", "BUSYLOOP", "REPLY", "all")
        assert {j[1].decode() for j in js} == ids and calls >= 2
        # raised again: one call does it all
        assert c.call("CONFIG", "SET", "scan-count-max", "100000") == "OK"
        js, calls = _scan_all(c, "JSCAN", "BUSYLOOP")
        assert {str(j) for j in js} == ids and calls == 1
        assert c.call("PING") == "PONG"
        c.close()


def _rss_kb(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def test_client_output_buffer_hard_limit_closes_a_client_that_never_reads(tmp_path: Path) -> None:
    # One worker: the queue's owner holds the connection, so the replies are built
    # in the read loop itself (forwarded replies count as they arrive: README, Limits).
    with NodeProc(tmp_path / "n", workers=1,
                  conf={"client-output-buffer-limit": "normal 4mb 1mb 60"}) as n:
        c = RawClient(n.port)
        body = "x" * 1000
        for _ in range(2000):  # one queue: QPEEK's reply is about 2 MB
            c.call("ADDJOB", "big", body, 0)
        rss_before = _rss_kb(n.worker_pids())
        greedy = RawClient(n.port)
        greedy.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        pipeline = encode_command("QPEEK", "big", 1_000_000) * 500  # 1 GB of replies
        try:
            greedy.sock.sendall(pipeline)
        except OSError:
            pass  # closed by the node while we were still sending
        wait_until(lambda: "overcoming of output buffer limits" in n.log_text(), 30,
                   "the node closing the greedy client", detail=n.output)
        assert greedy.closed()
        # The node keeps serving everybody else, its memory did not follow the pipeline.
        assert c.call("PING") == "PONG"
        assert c.call("QLEN", "big") == 2000
        assert _rss_kb(n.worker_pids()) - rss_before < 200_000
        c.close()


def test_client_output_buffer_soft_limit_closes_after_its_seconds(tmp_path: Path) -> None:
    with NodeProc(tmp_path / "n", workers=1,
                  conf={"client-output-buffer-limit": "normal 0 1mb 1"}) as n:
        c = RawClient(n.port)
        for _ in range(2000):
            c.call("ADDJOB", "big", "x" * 1000, 0)
        slow = RawClient(n.port)
        slow.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        slow.send(encode_command("QPEEK", "big", 2000) * 3)  # about 6 MB, never read
        time.sleep(2.5)  # over the soft limit for longer than its 1 s...
        slow.send(encode_command("PING"))  # ...seen at the next reply: closed
        wait_until(lambda: "overcoming of output buffer limits" in n.log_text(), 30,
                   "the node closing the slow client", detail=n.output)
        assert slow.closed()
        # Under the soft limit nothing happens, however long.
        ok = RawClient(n.port)
        ok.send(encode_command("QPEEK", "big", 100))
        time.sleep(1.5)
        ok.send(encode_command("PING"))
        assert len(ok.read()) == 100 and ok.read() == "PONG"
        assert c.call("PING") == "PONG"
        c.close()


random_rounds = 60


def _random_command(rng: random.Random) -> bytes:
    words = [b"ADDJOB", b"GETJOB", b"QPEEK", b"JSCAN", b"QSCAN", b"ACKJOB", b"PING", b"CLUSTER",
             b"CONFIG", b"INFO", b"DEBUG", b"NACK", b"SHOW", b"HELLO", b"CLIENT", b"\xff\x00"]
    shape = rng.randrange(5)
    if shape == 0:  # a random binary blob
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))
    if shape == 1:  # an argument count or a bulk length far over the limits
        return rng.choice([b"*%d\r\n" % rng.randrange(2**20, 2**62),
                           b"*1\r\n$%d\r\n" % rng.randrange(2**20, 2**62)])
    if shape == 2:  # a long inline line
        return b"PING " + b"x" * rng.randrange(60_000, 200_000) + b"\r\n"
    args = [rng.choice(words)] + [rng.choice([b"0", b"-1", b"9223372036854775808", b"COUNT",
                                              b"FROM", b"q", b"x" * rng.randrange(200)])
                                  for _ in range(rng.randrange(8))]
    return encode_command(*args) if shape == 3 else b" ".join(args) + b"\r\n"


def test_random_and_oversized_commands_and_frames_leave_the_node_serving(tmp_path: Path) -> None:
    rng = random.Random(11)
    conf = {"client-query-buffer-bytes-max": "65536", "proto-max-bulk-len": "100000",
            "proto-max-multibulk-len": "1000"}
    with NodeProc(tmp_path / "n", workers=2, conf=conf) as n:
        keep = RawClient(n.port)
        job_id = keep.call("ADDJOB", "keep", "body", 0)
        for _ in range(random_rounds):
            bad = RawClient(n.port, timeout_s=0.3)
            try:
                bad.send(_random_command(rng))
                bad.closed()  # replies or a close, whatever comes within the timeout
            except OSError:
                pass  # closed by the node while we sent: fine
            bad.close()
            # the bus port gets random bytes and frames with random kinds and metadata
            with socket.create_connection(("127.0.0.1", n.port + 10000), timeout=2) as s:
                try:
                    s.sendall(rng.choice([
                        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))),
                        frames.encode(rng.randrange(256), {"k": "REPLJOB", "s": -1, "m": None},
                                      [b"\x01" * rng.randrange(100)]),
                        frames._HEAD.pack(frames.MAGIC, frames.VERSION, 1, 2**31, 0),
                    ]))
                except OSError:
                    pass
            assert keep.call("PING") == "PONG"
        assert str(keep.call("SHOW", job_id)[1], "ascii") == job_id
        assert keep.call("QLEN", "keep") == 1
        log = n.log_text()
        assert "Traceback" not in log, log[-3000:]
        keep.close()

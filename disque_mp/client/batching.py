"""Producing and acknowledging without a round trip per job, for ``Disque``.

- ``AddWindow``: ADDJOBs pipelined on a connection of their own, at most
  ``window`` of them sent and not yet answered (RabbitMQ's asynchronous
  publisher confirms, with a bound). ``add`` returns once the command is
  written; an error reply surfaces as an exception from the next ``add`` (which
  then sends nothing: call it again) or from ``flush``, which waits for every
  reply; each error is raised once, and the adds after a refused one go on. A dropped connection (or a node
  that answers -LEAVING) moves to another node and sends the unanswered ADDJOBs
  again: at-least-once, as a resent ``add_job`` is. Nothing is dropped
  silently: at interpreter exit the adds still unanswered are waited for and
  an error is logged.
- ``AckBatcher``: a thread that sends ACKJOB for the IDs handed to it, all the
  IDs gathered while the previous ACKJOB was in flight in one command (one
  round trip per batch, not per job). A failed ACKJOB is logged: the jobs are
  not lost, the node delivers them again after their retry time.

Both are thread-safe.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Any, Unpack

import redis

from disque_mp.client import core
from disque_mp.client.core import DisqueError

if TYPE_CHECKING:
    from disque_mp.client.sync import Disque

log = logging.getLogger("disque_mp.client")

# ADDJOBs sent and not yet answered, by default: enough to hide a round trip of a
# few hundred microseconds behind the producer's own work, small enough that a
# dropped connection resends little (the bound on client memory and resends).
add_window_default = 128
add_window_max = 10_000
# IDs per ACKJOB sent by the AckBatcher (one command's size stays far under the
# client's pipeline_bytes_max: 1000 IDs are ~41 KB).
ack_batch_ids_max = 1000
# How long flush/close wait for the ACKJOBs in flight before giving up (logged).
ack_flush_timeout_s = 30.0


class AddWindow:
    """Pipelined ADDJOB with a bounded window of unanswered commands (see module doc)."""

    def __init__(self, client: Disque, window: int = add_window_default) -> None:
        if not 1 <= window <= add_window_max:
            raise ValueError(f"window must be 1..{add_window_max}")
        self.client = client
        self.window = window
        self._lock = threading.RLock()
        self._sent: deque[list[Any]] = deque()  # commands written, reply not read, in order
        self._error: DisqueError | None = None  # the first error reply not yet raised
        self._redis: redis.Redis | None = None
        self._conn: Any = None
        self.confirmed = 0  # ADDJOBs the node answered with a job ID
        self._drops = 0  # connections lost in a row, no reply read in between
        _live_windows.add(self)

    @property
    def pending(self) -> int:
        """ADDJOBs written and not yet answered."""
        return len(self._sent)

    def add(self, queue: str | bytes, body: bytes | str, timeout_ms: int = 0,
            **options: Unpack[core.AddJobOptions]) -> None:
        """Send one ADDJOB; raise the error of an earlier one, if any came back."""
        args = core.addjob_args(queue, body, timeout_ms, **options)
        with self._lock:
            self._raise_error()
            while len(self._sent) >= self.window:
                self._read_one()
            self._send([args])
            self._read_ready()
        # an error read just now is an earlier add's: raised by the next call, never by
        # this one, whose ADDJOB is already on the wire (raising here would tell the
        # caller it failed and invite a second copy)

    def flush(self) -> None:
        """Wait for every reply; raise the first error reply not raised yet."""
        with self._lock:
            while self._sent:
                self._read_one()
        self._raise_error()

    def close(self) -> None:
        """flush, then drop the connection (errors are raised, as flush's)."""
        try:
            self.flush()
        finally:
            with self._lock:
                self._disconnect()
            _live_windows.discard(self)

    # ---- inside, with the lock held

    def _raise_error(self) -> None:
        with self._lock:
            err, self._error = self._error, None
        if err is not None:
            raise err

    def _connection(self) -> Any:
        if self._conn is None:
            self.client._client()  # connects the client (HELLO) if it is not yet
            host, port = self.client.topology.current or ("127.0.0.1", 7711)
            self._redis = self.client._make_redis(host, port)
            self._conn = self._redis.connection_pool.get_connection()
        return self._conn

    def _disconnect(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
        if self._redis is not None:
            self._redis.close()
        self._redis = self._conn = None

    def _send(self, commands: list[list[Any]]) -> None:
        """Write the commands (the window's unanswered ones first after a failover)."""
        attempt = 0
        while True:
            try:
                conn = self._connection()
                conn.send_packed_command(conn.pack_commands(commands), check_health=False)
                self._sent.extend(commands)
                return
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                commands = [*self._sent, *commands] if self._sent else commands
                self._sent.clear()
                attempt = self._move(exc, attempt)

    def _move(self, exc: Exception, attempt: int) -> int:
        """Another node, after a drop or -LEAVING (within the client's failover budget)."""
        self._disconnect()
        self.client._raise_unless_retrying(exc, attempt, "ADDJOB (pipelined)")
        self.client.connect(avoid=self.client.topology.current)
        return attempt + 1

    def _read_ready(self) -> None:
        """Read the replies already here, without waiting."""
        while self._sent and self._conn is not None:
            try:
                if not self._conn.can_read(0):
                    return
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                self._dropped(exc)
                return
            self._read_one()

    def _dropped(self, exc: Exception) -> None:
        """The connection is gone: every unanswered ADDJOB goes again, to another node.
        Connections lost in a row count against the client's failover budget: past
        it, DisqueConnectionError (the unanswered adds may or may not have landed)."""
        lost = list(self._sent)
        self._sent.clear()
        self._drops += 1
        self._move(exc, self._drops - 1)
        self._send(lost)

    def _read_one(self) -> None:
        """Wait for the oldest unanswered ADDJOB's reply."""
        conn = self._conn
        try:
            assert conn is not None
            conn.read_response()
        except redis.ResponseError as exc:
            err = core.map_redis_error(exc)
            args = self._sent.popleft()
            if core.is_leaving(err):
                self._resend_elsewhere(err, args)
            elif self._error is None:
                self._error = err
            return
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            self._dropped(exc)
            return
        self._sent.popleft()
        self.confirmed += 1
        self._drops = 0

    def _resend_elsewhere(self, err: DisqueError, first: list[Any]) -> None:
        """The node is leaving: the rest of the window goes to another node with ``first``."""
        rest = list(self._sent)
        self._sent.clear()
        self._drops += 1
        try:
            self._move(err, self._drops - 1)
        except DisqueError as final:
            self._error = self._error or final
            return
        self._send([first, *rest])


class AckBatcher:
    """ACKJOB in batches from a thread of its own (see module doc)."""

    def __init__(self, client: Disque, batch_ids_max: int = ack_batch_ids_max) -> None:
        self.client = client
        self.batch_ids_max = batch_ids_max
        self._pending: list[str] = []
        self._in_flight = 0
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self.batches = 0  # ACKJOBs sent (for tests and stats)

    def ack(self, job_id: str) -> None:
        """Acknowledge soon: the ID goes in the next ACKJOB."""
        with self._cond:
            stopped = self._stopped
            if not stopped:
                self._pending.append(job_id)
                self._start_and_wake()
        if stopped:  # closed: one ACKJOB of its own, as an unbatched ack
            self.client.ack(job_id)

    def _start_and_wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="disque-acks", daemon=True)
            self._thread.start()
        self._cond.notify_all()


    def flush(self, timeout_s: float = ack_flush_timeout_s) -> bool:
        """Wait until every ID handed in was sent (answered or failed); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending and not self._in_flight,
                                       timeout_s)

    def close(self) -> None:
        if not self.flush():
            log.warning("ACKJOB of %d jobs still pending at close: they come back after "
                        "their retry time", len(self._pending))
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._stopped)
                if not self._pending:
                    return
                batch = self._pending[:self.batch_ids_max]
                del self._pending[:self.batch_ids_max]
                self._in_flight = len(batch)
            try:
                self.client.ack(batch)
            except (DisqueError, redis.RedisError, OSError) as exc:
                log.warning("ACKJOB of %d jobs failed (%s): they come back after their "
                            "retry time", len(batch), exc)
            with self._cond:
                self._in_flight = 0
                self.batches += 1
                self._cond.notify_all()


_live_windows: weakref.WeakSet[AddWindow] = weakref.WeakSet()


def flush_windows() -> None:
    """Flush every open AddWindow of this process (errors logged, not raised): what a
    producer that does not know its broker's windows calls before it measures or exits."""
    for window in list(_live_windows):
        try:
            window.flush()
        except (DisqueError, redis.RedisError, OSError) as exc:
            log.error("pipelined ADDJOBs: %s", exc)


@atexit.register
def _flush_at_exit() -> None:
    """A plain loop that adds and exits still gets its adds answered (or logged)."""
    flush_windows()

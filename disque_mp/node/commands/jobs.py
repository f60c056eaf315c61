"""Argument parsing for the job and queue commands, with the reference's error texts.

The ``cmd_*`` handlers run the commands routed ``queue`` and ``ids`` on the owning
worker's shard; ``parse_getjob``, ``parse_qscan`` and ``parse_jscan`` give the
router typed values for the commands it spreads over several workers. The fast
paths (``router.py``, and ``owner.py`` for the shapes it runs) use the same code for the same shapes: ``addjob_plain`` for
``ADDJOB q body timeout``, ``parse_getjob`` and ``getjob_now`` for every GETJOB.
Arity was already checked by the front end; the checks here still guard
against short argument lists so no input can raise.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from disque_mp.node.errors import (
    ERR_BADID,
    ERR_COUNT,
    ERR_CURSOR,
    ERR_DELAY,
    ERR_MAXLEN,
    ERR_NOT_INT,
    ERR_REPLICATE,
    ERR_RETRY,
    ERR_STATE,
    ERR_SYNTAX,
    ERR_TIMEOUT_NEGATIVE,
    ERR_TIMEOUT_NOT_INT,
    ERR_TTL,
    err_arity,
)
from workers.ids import DEAD_PREFIX, is_valid_job_id
from workers.job import (
    STATE_BY_NAME,
    JobExt,
    dead_reason_bytes_max,
    dedup_bytes_max,
    delay_max_s,
    group_bytes_max,
    maxdeliver_max,
    priority_max,
    queue_name_bytes_max,
    retry_max_s,
    ttl_max_s,
)
from workers.replies import NULL_ARRAY, Error
from workers.shard import (
    ERR_DELAY_MAX,
    ERR_MAXDELIVER,
    ERR_RETRY_MAX,
    ERR_TTL_MAX,
    Shard,
    jscan_count_default,
    qscan_count_default,
    ttl_default_s,
)

replicate_max: Final = 65535  # Disque's bound (a 16-bit field on the wire)


class Limits:
    """The work one command may do (config getjob-count-max, qpeek-count-max,
    qgroups-count-max, scan-count-max, redrive-count-max), the longest queue name (queue-name-bytes-max), the groups
    one queue holds (queue-groups-max) and one client's
    share of a WAITJOB table (waitjob-entries-per-client-max): each worker applies its
    config here at start and on CONFIG SET."""

    __slots__ = ("getjob_count_max", "qpeek_count_max", "scan_count_max",
                 "queue_name_bytes_max", "err_queue_name", "waitjob_entries_per_client_max",
                 "redrive_count_max", "qgroups_count_max", "queue_groups_max",
                 "err_queue_groups", "qlimit_value_max", "qlimit_queues_max",
                 "dedup_keep_max_s", "err_dedup_keep")

    def __init__(self) -> None:
        self.getjob_count_max = 10_000
        self.qpeek_count_max = 10_000
        self.qgroups_count_max = 10_000
        self.scan_count_max = 1_000
        self.waitjob_entries_per_client_max = 100_000
        self.redrive_count_max = 10_000
        self.queue_groups_max = 0
        self.err_queue_groups = ERR_SYNTAX
        self.set_queue_groups_max(100_000)
        self.qlimit_value_max = 1_000_000
        self.qlimit_queues_max = 100_000
        self.queue_name_bytes_max = 0
        self.err_queue_name = ERR_SYNTAX
        self.set_queue_name_max(queue_name_bytes_max - len(DEAD_PREFIX))
        self.dedup_keep_max_s = 0
        self.err_dedup_keep = ERR_SYNTAX
        self.set_dedup_keep_max(7 * 24 * 3600)

    def set_queue_name_max(self, n: int) -> None:
        """config queue-name-bytes-max: the commands that make a queue or send its
        name to other nodes refuse a longer one (a peer drops a bus frame whose
        name is over 64 KB, a job record holds 0xFFFF bytes; MAXDELIVER adds ``dead:``
        to the name). The shard's own text for the record's bound."""
        self.queue_name_bytes_max = n
        self.err_queue_name = Error(f"ERR queue name too long (at most {n} bytes)")

    def set_queue_groups_max(self, n: int) -> None:
        """config queue-groups-max: ADDJOB ... GROUP refuses a group more in a queue
        that holds this many groups with queued jobs (jobs of its groups still go in)."""
        self.queue_groups_max = n
        self.err_queue_groups = Error(
            f"ERR too many groups in this queue (at most {n}, queue-groups-max)")


    def set_dedup_keep_max(self, n: int) -> None:
        """ADDJOB ... DEDUP-KEEP seconds: 1 to ``n`` (config dedup-keep-max)."""
        self.dedup_keep_max_s = n
        self.err_dedup_keep = Error(
            f"ERR DEDUP-KEEP must be between 1 and {n} seconds (dedup-keep-max)")


limits: Final = Limits()


def apply_limits(cfg: Any) -> None:
    limits.getjob_count_max = int(cfg.getjob_count_max)
    limits.qpeek_count_max = int(cfg.qpeek_count_max)
    limits.qgroups_count_max = int(cfg.qgroups_count_max)
    limits.scan_count_max = int(cfg.scan_count_max)
    limits.set_queue_name_max(int(cfg.queue_name_bytes_max))
    limits.waitjob_entries_per_client_max = int(cfg.waitjob_entries_per_client_max)
    limits.redrive_count_max = int(cfg.redrive_count_max)
    limits.set_queue_groups_max(int(cfg.queue_groups_max))
    limits.qlimit_value_max = int(cfg.qlimit_value_max)
    limits.qlimit_queues_max = int(cfg.qlimit_queues_max)
    limits.set_dedup_keep_max(int(cfg.dedup_keep_max))


def long_queue_name(queues: list[bytes]) -> Error | None:
    """The error for the first name over queue-name-bytes-max, or None."""
    n = limits.queue_name_bytes_max
    for q in queues:
        if len(q) > n:
            return limits.err_queue_name
    return None

# Redis' string2ll: optional minus, no leading zeros, no plus, no spaces, 64-bit.
_INT_RE = re.compile(rb"\A(?:0|-?[1-9][0-9]{0,18})\Z")
_UINT_RE = re.compile(rb"\A[0-9]{1,20}\Z")
_short_digits_max: Final = 9  # parse_int sums up to this many digits by hand (< 2**30)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def parse_int(raw: bytes) -> int | None:
    """A 64-bit signed integer in Redis' strict form, or None."""
    n = len(raw)
    if 0 < n <= _short_digits_max and (raw[0] != 48 or n == 1):
        # the usual argument (a COUNT, a TIMEOUT, a DELAY): a few digits, no sign, no
        # leading zero; summed here, as the regex and int() cost some 2,500
        # instructions together (compiled, each step of the sum stays inline, and the
        # digits are checked in it: bytes.isdigit() is a method call)
        v = 0
        digits = True
        for c in raw:
            if c < 48 or c > 57:
                digits = False
                break
            v = v * 10 + c - 48
        if digits:
            return v
    if _INT_RE.match(raw) is None:
        return None
    v = int(raw)
    return v if _INT64_MIN <= v <= _INT64_MAX else None


def parse_timeout_ms(raw: bytes) -> int | Error:
    if raw == b"0":  # what nearly every ADDJOB sends
        return 0
    v = parse_int(raw)
    if v is None:
        return ERR_TIMEOUT_NOT_INT
    if v < 0:
        return ERR_TIMEOUT_NEGATIVE
    return v


def parse_cursor(raw: bytes) -> int | None:
    """Redis' scan cursor: an unsigned 64-bit decimal."""
    if _UINT_RE.match(raw) is None:
        return None
    v = int(raw)
    return v if v < (1 << 64) else None


def _job_ids(args: list[bytes]) -> list[str] | Error:
    """Every ID must be well formed before any is acted on (as in Disque)."""
    for raw in args:
        if not is_valid_job_id(raw):
            return ERR_BADID
    return [raw.decode("ascii") for raw in args]


# ------------------------------------------------------------------ ADDJOB


@dataclass(init=False)  # the __init__ below compiles to a native one (a dataclass's would not)
class AddJobArgs:
    queue: bytes
    body: bytes
    timeout_ms: int
    replicate: int | None
    delay_s: int
    retry_s: int | None
    ttl_s: int
    maxlen: int
    async_: bool
    maxdeliver: int  # 0 = none (the MAXDELIVER extension)
    ext: JobExt | None  # GROUP / DEDUP (extensions); None = neither

    def __init__(self, queue: bytes, body: bytes, timeout_ms: int, replicate: int | None = None,
                 delay_s: int = 0, retry_s: int | None = None, ttl_s: int = ttl_default_s,
                 maxlen: int = 0, async_: bool = False, maxdeliver: int = 0) -> None:
        self.queue = queue
        self.body = body
        self.timeout_ms = timeout_ms
        self.replicate = replicate
        self.delay_s = delay_s
        self.retry_s = retry_s
        self.ttl_s = ttl_s
        self.maxlen = maxlen
        self.async_ = async_
        self.maxdeliver = maxdeliver
        self.ext = None


def parse_addjob(args: list[bytes]) -> AddJobArgs | Error:
    """``queue body ms-timeout [options]``: options first, then the timeout (Disque's order)."""
    if len(args) < 3:
        return err_arity("addjob")
    if len(args[0]) > limits.queue_name_bytes_max:
        return limits.err_queue_name
    a = AddJobArgs(args[0], args[1], 0)
    i, n = 3, len(args)
    while i < n:
        opt = args[i].lower()
        last = i == n - 1
        if opt == b"async":
            a.async_ = True
            i += 1
            continue
        ext_option = None if last else _EXT_OPTIONS.get(opt)
        if ext_option is not None:
            err = ext_option(a, opt, args[i + 1])
            if err is not None:
                return err
            i += 2
            continue
        spec = None if last else _ADDJOB_OPTS.get(opt)
        if spec is None:
            return ERR_SYNTAX
        field, lowest, highest, err_low, err_high = spec
        v = parse_int(args[i + 1])
        if v is None or v < lowest:
            return err_low
        if v > highest:
            return err_high
        setattr(a, field, v)
        i += 2
    t = parse_timeout_ms(args[2])
    if isinstance(t, Error):
        return t
    a.timeout_ms = t
    if a.ext is not None and a.ext.keep_s and not a.ext.dedup:
        return ERR_DEDUP_KEEP_ALONE
    return a


def _addjob_ext(a: AddJobArgs, opt: bytes, value: bytes) -> Error | None:
    """``GROUP name`` / ``DEDUP key`` (extensions): 1 to 256 bytes each."""
    group = opt == b"group"
    if not 0 < len(value) <= (group_bytes_max if group else dedup_bytes_max):
        return ERR_GROUP if group else ERR_DEDUP
    if a.ext is None:
        a.ext = JobExt()
    if group:
        a.ext.group = value
    else:
        a.ext.dedup = value
    return None


def _addjob_priority(a: AddJobArgs, value: bytes) -> Error | None:
    """``PRIORITY p`` (extension): 0 to 9, higher delivered first; 0 (the default)
    gives the job no field at all."""
    v = parse_int(value)
    if v is None or not 0 <= v <= priority_max:
        return ERR_PRIORITY
    if v:
        if a.ext is None:
            a.ext = JobExt()
        a.ext.priority = v
    elif a.ext is not None:
        a.ext.priority = 0
    return None


ERR_PRIORITY: Final = Error(f"ERR PRIORITY must be an integer from 0 to {priority_max}")
ERR_GROUP: Final = Error(f"ERR GROUP name must be 1 to {group_bytes_max} bytes")
ERR_DEDUP: Final = Error(f"ERR DEDUP key must be 1 to {dedup_bytes_max} bytes")
ERR_DEDUP_KEEP_ALONE: Final = Error("ERR DEDUP-KEEP needs a DEDUP key")
# ADDJOB's extension options, each with its parser (the job's ``ext`` fields).
_EXT_OPTIONS: Final[dict[bytes, Callable[[AddJobArgs, bytes, bytes], Error | None]]] = {
    b"group": lambda a, opt, value: _addjob_ext(a, opt, value),
    b"dedup": lambda a, opt, value: _addjob_ext(a, opt, value),
    b"priority": lambda a, opt, value: _addjob_priority(a, value),
    b"dedup-keep": lambda a, opt, value: _addjob_keep(a, value),
}


def _addjob_keep(a: AddJobArgs, value: bytes) -> Error | None:
    """``DEDUP-KEEP seconds`` (with DEDUP: checked once every option is read)."""
    keep = parse_int(value)
    if keep is None or not 0 < keep <= limits.dedup_keep_max_s:
        return limits.err_dedup_keep
    if a.ext is None:
        a.ext = JobExt()
    a.ext.keep_s = keep
    return None


# ADDJOB's numeric options: the field each sets, its smallest and largest value, the
# error below the smallest (or not a number) and above the largest (the reference's
# texts; the maxima are ours, see workers/job.py).
_ADDJOB_OPTS: Final[dict[bytes, tuple[str, int, int, Error, Error]]] = {
    b"replicate": ("replicate", 1, replicate_max, ERR_REPLICATE, ERR_REPLICATE),
    b"ttl": ("ttl_s", 1, ttl_max_s, ERR_TTL, ERR_TTL_MAX),
    b"retry": ("retry_s", 0, retry_max_s, ERR_RETRY, ERR_RETRY_MAX),
    b"delay": ("delay_s", 0, delay_max_s, ERR_DELAY, ERR_DELAY_MAX),
    b"maxlen": ("maxlen", 1, sys.maxsize, ERR_MAXLEN, ERR_MAXLEN),
    b"maxdeliver": ("maxdeliver", 1, maxdeliver_max, ERR_MAXDELIVER, ERR_MAXDELIVER),
}


def addjob_plain(shard: Shard, queue: bytes, body: bytes, timeout: bytes, token: int,
                 now_ms: int, status: bool = True) -> Any:
    """``ADDJOB queue body timeout``, the common form: no options, no allocations
    beyond the job (the general path and the router's fast path both run it;
    ``status=False``: a job added here and now is answered by its ID, a plain str)."""
    t = parse_timeout_ms(timeout)
    if not isinstance(t, int):  # an Error (an int's check is native, an Error's a call)
        return t
    if len(queue) > limits.queue_name_bytes_max:
        return limits.err_queue_name
    return shard.op_addjob(queue, body, timeout_ms=t, replicate=None, delay_s=0,
                           retry_s=None, ttl_s=ttl_default_s, maxlen=0, async_=False,
                           token=token, now_ms=now_ms, status=status)


def cmd_addjob(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    if len(args) == 3:
        return addjob_plain(shard, args[0], args[1], args[2], token, now_ms)
    a = parse_addjob(args)
    if isinstance(a, Error):
        return a
    if a.ext is not None and a.ext.group and shard.op_groups_full(
            a.queue, a.ext.group, limits.queue_groups_max):
        return limits.err_queue_groups
    return shard.op_addjob(a.queue, a.body, timeout_ms=a.timeout_ms, replicate=a.replicate,
                           delay_s=a.delay_s, retry_s=a.retry_s, ttl_s=a.ttl_s,
                           maxlen=a.maxlen, async_=a.async_, token=token, now_ms=now_ms,
                           maxdeliver=a.maxdeliver, ext=a.ext)


# ------------------------------------------------------------------ GETJOB


@dataclass(init=False)  # the __init__ below compiles to a native one (a dataclass's would not)
class GetJobArgs:
    nohang: bool
    timeout_ms: int  # 0 = block forever
    count: int
    withcounters: bool
    queues: list[bytes]

    def __init__(self, nohang: bool, timeout_ms: int, count: int, withcounters: bool,
                 queues: list[bytes]) -> None:
        self.nohang = nohang
        self.timeout_ms = timeout_ms
        self.count = count
        self.withcounters = withcounters
        self.queues = queues


# GETJOB's option words; the spellings clients send are found without lowercasing.
_NOHANG: Final = 1
_WITHCOUNTERS: Final = 2
_TIMEOUT: Final = 3
_COUNT: Final = 4
_FROM: Final = 5
_GETJOB_WORDS: Final = {b"nohang": _NOHANG, b"withcounters": _WITHCOUNTERS, b"timeout": _TIMEOUT,
                        b"count": _COUNT, b"from": _FROM}


def _getjob_word(word: bytes) -> int:
    """The code of a GETJOB option word (0: none). The two usual spellings by compares
    (each read's words are new bytes objects: a dict would hash each), others lowered."""
    n = len(word)
    if n == 4:
        if word == b"FROM" or word == b"from":
            return _FROM
    elif n == 5:
        if word == b"COUNT" or word == b"count":
            return _COUNT
    elif n == 7:
        if word == b"TIMEOUT" or word == b"timeout":
            return _TIMEOUT
    elif n == 6:
        if word == b"NOHANG" or word == b"nohang":
            return _NOHANG
    elif n == 12:
        if word == b"WITHCOUNTERS" or word == b"withcounters":
            return _WITHCOUNTERS
    return _GETJOB_WORDS.get(word.lower(), 0)


def parse_getjob(args: list[bytes], start: int = 0) -> GetJobArgs | Error:
    """``[NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM q1 ... qN``, read from
    ``args[start]`` on (the router passes the whole command and 1)."""
    nohang = withcounters = False
    timeout_ms = 0
    count = 1
    i, n = start, len(args)
    while i < n:
        opt = _getjob_word(args[i])
        last = i == n - 1
        if opt == _NOHANG:
            nohang = True
        elif opt == _WITHCOUNTERS:
            withcounters = True
        elif opt == _TIMEOUT and not last:
            t = parse_timeout_ms(args[i + 1])
            if not isinstance(t, int):  # an Error (an int's check is native, an Error's a call)
                return t
            timeout_ms = t
            i += 1
        elif opt == _COUNT and not last:
            c = parse_int(args[i + 1])
            if c is None:
                return ERR_NOT_INT
            if c <= 0:
                return ERR_COUNT
            count = c if c <= limits.getjob_count_max else limits.getjob_count_max
            i += 1
        elif opt == _FROM and not last:
            queues = args[i + 1 :]
            err = long_queue_name(queues)
            if err is not None:
                return err
            return GetJobArgs(nohang, timeout_ms, count, withcounters, queues)
        else:
            return ERR_SYNTAX
        i += 1
    return ERR_SYNTAX  # no FROM, or no queue after it


def getjob_now(shard: Shard, g: GetJobArgs, now_ms: int) -> Any:
    """GETJOB over queues this shard owns, without blocking: the jobs taken,
    ``NULL_ARRAY`` for NOHANG, or None when the client is to wait (the caller
    blocks it). The router's fast and general paths and its mesh serving all run it."""
    entries = shard.op_take(g.queues, g.count, g.withcounters, now_ms)
    if entries:
        return entries
    return NULL_ARRAY if g.nohang else None


# ------------------------------------------------------------------ QSCAN / JSCAN


@dataclass(slots=True)
class QScan:
    cursor: int
    count: int
    busyloop: bool
    minlen: int
    maxlen: int  # 0 = no bound
    importrate: int


@dataclass(slots=True)
class JScan:
    cursor: int
    count: int
    busyloop: bool
    queue: bytes | None
    states: set[int] | None
    reply_all: bool


def _scan_value(raw: bytes) -> int | Error:
    v = parse_int(raw)
    return ERR_NOT_INT if v is None else v


def _scan_count(raw: bytes) -> int | Error:
    """COUNT's value: an integer of at least 1, capped at scan_count_max."""
    v = _scan_value(raw)
    if isinstance(v, Error):
        return v
    return ERR_SYNTAX if v < 1 else min(v, limits.scan_count_max)


ScanT = TypeVar("ScanT", bound="QScan | JScan")


def _scan_words(args: list[bytes], s: ScanT,
                valued: Callable[[ScanT, bytes, bytes], Error | bool]) -> ScanT | Error:
    """QSCAN's and JSCAN's arguments into ``s``: BUSYLOOP (COUNT becomes
    scan_count_max: everything in one call, within the bound of one call), one
    cursor anywhere, and each other word with a value after it offered to
    ``valued(s, word, value)``: True when it took the pair, False when the word is
    no option of the command (then it must be the cursor), or the Error to reply."""
    cursor_set = False
    i, n = 0, len(args)
    while i < n:
        opt = args[i].lower()
        if opt == b"busyloop":
            s.busyloop = True
            i += 1
            continue
        took = valued(s, opt, args[i + 1]) if i < n - 1 else False
        if isinstance(took, Error):
            return took
        if took:
            i += 2
            continue
        c = parse_cursor(args[i])
        if cursor_set or c is None:
            return ERR_SYNTAX if cursor_set else ERR_CURSOR
        s.cursor, cursor_set = c, True
        i += 1
    if s.busyloop:
        s.count = limits.scan_count_max
    return s


def _qscan_option(s: QScan, opt: bytes, raw: bytes) -> Error | bool:
    """QSCAN's valued options (see ``_scan_words``)."""
    if opt not in (b"count", b"minlen", b"maxlen", b"importrate"):
        return False
    v = _scan_count(raw) if opt == b"count" else _scan_value(raw)
    if isinstance(v, Error):
        return v
    setattr(s, opt.decode(), v)
    return True


def parse_qscan(args: list[bytes]) -> QScan | Error:
    """``[cursor] [COUNT n] [BUSYLOOP] [MINLEN n] [MAXLEN n] [IMPORTRATE n]``, cursor anywhere."""
    return _scan_words(args, QScan(0, qscan_count_default, False, 0, 0, 0), _qscan_option)


def _jscan_option(s: JScan, opt: bytes, raw: bytes) -> Error | bool:
    """JSCAN's valued options (see ``_scan_words``)."""
    if opt == b"count":
        v = _scan_count(raw)
        if isinstance(v, Error):
            return v
        s.count = v
    elif opt == b"queue":
        s.queue = raw
    elif opt == b"state":
        st = STATE_BY_NAME.get(raw.lower().decode("latin-1"))
        if st is None:
            return ERR_STATE
        s.states = (s.states or set()) | {st}
    elif opt == b"reply":
        kind = raw.lower()
        if kind not in (b"all", b"id"):
            return ERR_SYNTAX
        s.reply_all = kind == b"all"
    else:
        return False
    return True


def parse_jscan(args: list[bytes]) -> JScan | Error:
    """``[cursor] [COUNT n] [BUSYLOOP] [QUEUE q] [STATE s]... [REPLY all|id]``, cursor anywhere."""
    return _scan_words(args, JScan(0, jscan_count_default, False, None, None, False),
                       _jscan_option)


# ------------------------------------------------------------------ job-ID commands


def _ids_cmd(op: str) -> Callable[[Shard, list[bytes], int, int], Any]:
    def handler(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
        ids = _job_ids(args)
        if isinstance(ids, Error):
            return ids
        return getattr(shard, op)(ids, now_ms)

    return handler


def _one_job_id(args: list[bytes], name: str) -> str | Error:
    """The one job ID of WORKING / SHOW, or the reference's error."""
    if len(args) != 1:
        return err_arity(name)
    ids = _job_ids(args)
    return ids if isinstance(ids, Error) else ids[0]


def cmd_working(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``WORKING id [PROGRESS value]`` (PROGRESS: the extension, workers/results.py)."""
    if len(args) == 3 and args[1].lower() == b"progress":
        job_id = _one_job_id(args[:1], "working")
        if isinstance(job_id, Error):
            return job_id
        return shard.op_working(job_id, now_ms, bytes(args[2]))
    job_id = _one_job_id(args, "working")
    return job_id if isinstance(job_id, Error) else shard.op_working(job_id, now_ms)


ERR_RESULT_ONE_ID: Final = Error("ERR RESULT takes exactly one job ID")
ERR_ACK_RESULT_ONE_ID: Final = Error("ERR ACKJOB ... RESULT takes exactly one job ID")


def one_id_error(name: bytes, tail: list[bytes]) -> Error | None:
    """The error of a command given several IDs that takes one (RESULT, ACKJOB ...
    RESULT), else None (the router checks before it splits the IDs by owner)."""
    if name == b"result":
        return ERR_RESULT_ONE_ID
    if name == b"working":  # the reference's arity 2 (PROGRESS is our option)
        return err_arity("working")
    if name == b"ackjob" and tail and tail[0] == b"result":
        return ERR_ACK_RESULT_ONE_ID
    return None


def cmd_ackjob(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``ACKJOB id ...``, or ``ACKJOB id RESULT value`` (the extension: one ID, the
    value kept as the job's result, workers/results.py)."""
    if len(args) < 3 or len(args[-2]) >= 40:  # IDs only (an option word is shorter)
        ids = _job_ids(args)
        return ids if isinstance(ids, Error) else shard.op_ackjob(ids, now_ms)
    raw_ids, word, value = split_tail(args, (b"result",))
    if word is None or value is None:
        ids = _job_ids(args)  # -BADID: a word that is no ID
        return ids if isinstance(ids, Error) else shard.op_ackjob(ids, now_ms)
    if len(raw_ids) != 1:
        return ERR_ACK_RESULT_ONE_ID if raw_ids else err_arity("ackjob")
    ids = _job_ids(raw_ids)
    if isinstance(ids, Error):
        return ids
    return shard.op_ack_result(ids[0], bytes(value), now_ms)


def cmd_result(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``RESULT id [TIMEOUT ms]``: the value, ``["progress", value]`` for a pending
    job that reported progress, null; with TIMEOUT a pending job is waited for (0:
    until it is done). GETJOB's TIMEOUT texts."""
    got = _ids_and_option(args, b"timeout", parse_timeout_ms, "result", absent=None)
    if isinstance(got, Error):
        return got
    ids, timeout_ms = got
    if len(ids) != 1:
        return ERR_RESULT_ONE_ID if ids else err_arity("result")
    return shard.op_result(token, ids[0], timeout_ms, now_ms)


def cmd_show(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    job_id = _one_job_id(args, "show")
    return job_id if isinstance(job_id, Error) else shard.op_show(job_id, now_ms)


# ------------------------------------------------------------------ queue commands


def cmd_qlen(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    if len(args) != 1:
        return err_arity("qlen")
    return shard.op_qlen(args[0])


def cmd_qpeek(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    if len(args) != 2:
        return err_arity("qpeek")
    count = parse_int(args[1])
    if count is None:
        return ERR_NOT_INT
    cap = limits.qpeek_count_max
    count = cap if count > cap else (-cap if count < -cap else count)
    return shard.op_qpeek(args[0], count)


def cmd_qstat(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    if len(args) != 1:
        return err_arity("qstat")
    return shard.op_qstat(args[0], now_ms)


qgroups_count_default: Final = 100  # QGROUPS without COUNT


def cmd_qgroups(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``QGROUPS queue [COUNT n]``: groups with queued jobs, largest first; COUNT
    is cut to qgroups-count-max."""
    if len(args) not in (1, 3):
        return err_arity("qgroups")
    count = qgroups_count_default
    if len(args) == 3:
        if args[1].lower() != b"count":
            return ERR_SYNTAX
        n = parse_int(args[2])
        if n is None or n < 0:
            return ERR_NOT_INT if n is None else ERR_SYNTAX
        count = n
    return shard.op_qgroups(args[0], min(count, limits.qgroups_count_max))


_PAUSE_OPTS = frozenset(("in", "out", "all", "none", "state", "bcast"))


def cmd_pause(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    if len(args) < 2:
        return err_arity("pause")
    opts = [a.lower().decode("latin-1") for a in args[1:]]
    for opt in opts:
        if opt not in _PAUSE_OPTS:
            return ERR_SYNTAX
    if len(args[0]) > limits.queue_name_bytes_max:
        return limits.err_queue_name
    return shard.op_pause(args[0], opts, now_ms)


# ------------------------------------------------------------------ extensions

_QLIMIT_FIELDS: Final = {b"active": 0, b"rate": 1, b"group-active": 2}


def cmd_qlimit(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``QLIMIT queue [ACTIVE n] [RATE n] [GROUP-ACTIVE n] [BCAST]``, ``QLIMIT queue``,
    ``QLIMIT queue RESET [BCAST]`` (workers/limits.py): every value checked before
    anything changes; the reply is the queue's limits after the command."""
    if not args:
        return err_arity("qlimit")
    if len(args[0]) > limits.queue_name_bytes_max:
        return limits.err_queue_name
    parsed = parse_qlimit(args[1:])
    if isinstance(parsed, Error):
        return parsed
    values, bcast = parsed
    return shard.op_qlimit(args[0], values, bcast, limits.qlimit_queues_max, now_ms)


def parse_qlimit(opts: list[bytes]) -> tuple[tuple[int | None, int | None, int | None] | None,
                                             bool] | Error:
    """QLIMIT's options: the values to set (None: show), BCAST; or the error."""
    values: list[int | None] = [None, None, None]
    given = reset = bcast = False
    i = 0
    while i < len(opts):
        word = opts[i].lower()
        if word == b"bcast":
            bcast = True
        elif word == b"reset":
            reset = True
        elif word in _QLIMIT_FIELDS and i + 1 < len(opts):
            n = parse_int(opts[i + 1])
            if n is None:
                return ERR_NOT_INT
            if not 0 <= n <= limits.qlimit_value_max:
                return Error(f"ERR {word.decode().upper()} must be between 0 and "
                             f"{limits.qlimit_value_max} (qlimit-value-max)")
            values[_QLIMIT_FIELDS[word]] = n
            given = True
            i += 1
        else:
            return ERR_SYNTAX
        i += 1
    if reset and given:
        return ERR_SYNTAX
    if reset:
        return (0, 0, 0), bcast
    if not given:
        return (None, bcast) if not bcast else ERR_SYNTAX
    return (values[0], values[1], values[2]), bcast



def split_tail(args: list[bytes], words: tuple[bytes, ...]) -> tuple[list[bytes], bytes | None,
                                                                    bytes | None]:
    """``id ... [WORD value]``: the IDs, the option word (lowercase) and its value.
    A job ID is 40 characters: no option word can be mistaken for one."""
    if len(args) >= 2 and len(args[-2]) < 40:
        word = args[-2].lower()
        if word in words:
            return args[:-2], word, args[-1]
    return args, None, None


def parse_delay_s(raw: bytes) -> int | Error:
    """A DELAY value: ADDJOB's bound and texts."""
    v = parse_int(raw)
    if v is None or v < 0:
        return ERR_DELAY
    return ERR_DELAY_MAX if v > delay_max_s else v


def _ids_and_option(args: list[bytes], word: bytes, parse: Callable[[bytes], Any],
                    name: str, absent: Any = 0) -> tuple[list[str], Any] | Error:
    """Job IDs followed by an optional ``WORD value`` (NACK's DELAY, WAITJOB's TIMEOUT):
    the IDs and the parsed value (``absent`` when absent), or the first error. The option
    with no ID before it is an arity error (``NACK DELAY 5``: the reference, which
    has no such option, answers ``-BADID`` for it; a bare ``NACK`` stays its 0)."""
    raw_ids, _, value = split_tail(args, (word,))
    option = absent
    if value is not None:
        if not raw_ids:
            return err_arity(name)
        v = parse(value)
        if isinstance(v, Error):
            return v
        option = v
    ids = _job_ids(raw_ids)
    if isinstance(ids, Error):
        return ids
    return ids, option


def cmd_nack(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``NACK id ... [DELAY seconds]``."""
    got = _ids_and_option(args, b"delay", parse_delay_s, "nack")
    if isinstance(got, Error):
        return got
    return shard.op_nack(got[0], now_ms, got[1])


def cmd_waitjob(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``WAITJOB id ... [TIMEOUT ms]``: GETJOB's TIMEOUT texts; 0 waits forever.
    ``args[0]`` is not the client's: the router puts the client's ID there, the owner
    of the share of the WAITJOB table the entries count in (the shard keeps them past
    the connection, until their jobs are done)."""
    got = _ids_and_option(args[1:], b"timeout", parse_timeout_ms, "waitjob")
    if isinstance(got, Error):
        return got
    return shard.op_waitjob(token, got[0], got[1], now_ms, args[0],
                            limits.waitjob_entries_per_client_max)


def cmd_globalqlen(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    if len(args) != 1:
        return err_arity("globalqlen")
    if len(args[0]) > limits.queue_name_bytes_max:
        return limits.err_queue_name
    return shard.op_globalqlen(token, args[0], now_ms)


def cmd_delqueue(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``DELQUEUE queue [LOCAL]``."""
    if not 1 <= len(args) <= 2:
        return err_arity("delqueue")
    if len(args) == 2 and args[1].lower() != b"local":
        return ERR_SYNTAX
    if len(args[0]) > limits.queue_name_bytes_max:
        return limits.err_queue_name
    return shard.op_delqueue(token, args[0], len(args) == 2, now_ms)


ERR_REASON: Final = Error(f"ERR REASON must be at most {dead_reason_bytes_max} bytes")
ERR_NOT_DEAD: Final = Error(
    f"ERR REDRIVE takes a dead-letter queue (a name starting with "
    f"'{DEAD_PREFIX.decode()}')")


def cmd_deadletter(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``DEADLETTER id ... [REASON text]``: how many jobs moved."""
    raw_ids, _, reason = split_tail(args, (b"reason",))
    if reason is not None:
        if not raw_ids:
            return err_arity("deadletter")
        if len(reason) > dead_reason_bytes_max:
            return ERR_REASON
    ids = _job_ids(raw_ids)
    if isinstance(ids, Error):
        return ids
    return shard.op_deadletter(ids, None if reason is None else bytes(reason), now_ms)


def cmd_redrive(shard: Shard, args: list[bytes], token: int, now_ms: int) -> Any:
    """``REDRIVE dead-queue [COUNT n]``: at most redrive-count-max jobs a call;
    ``REDRIVE dead-queue ID id ...``: those jobs (one dead letter retried)."""
    queue = args[0]
    if not queue.startswith(DEAD_PREFIX) or len(queue) == len(DEAD_PREFIX):
        return ERR_NOT_DEAD
    if len(args) >= 3 and args[1].lower() == b"id":
        if len(args) - 2 > limits.redrive_count_max:
            return Error(f"ERR REDRIVE ID takes at most {limits.redrive_count_max} job IDs "
                         "(redrive-count-max)")
        ids = _job_ids(args[2:])
        if isinstance(ids, Error):
            return ids
        return shard.op_redrive_ids(queue, ids, now_ms)
    if len(args) not in (1, 3):
        return ERR_SYNTAX
    count = limits.redrive_count_max
    if len(args) == 3:
        if args[1].lower() != b"count":
            return ERR_SYNTAX
        c = parse_int(args[2])
        if c is None:
            return ERR_NOT_INT
        if c <= 0:
            return ERR_COUNT
        count = min(c, count)
    return shard.op_redrive(queue, count, now_ms)


cmd_fastack: Final = _ids_cmd("op_fastack")
cmd_enqueue: Final = _ids_cmd("op_enqueue")
cmd_dequeue: Final = _ids_cmd("op_dequeue")
cmd_deljob: Final = _ids_cmd("op_deljob")

"""disque_mp/node/slowlog.py: entries, cuts, bounds and the merge of workers' logs."""

from __future__ import annotations

from disque_mp.node.slowlog import SlowLog, merge, slowlog_arg_bytes_max, slowlog_args_max


def test_length_bound_follows_the_setting() -> None:
    log = SlowLog(1, 2)
    log.configure(0, 3)
    for i in range(5):
        log.add([b"PING", b"%d" % i], 1000 * i)
    assert [e[3][1] for e in log.newest(-1)] == [b"4", b"3", b"2"]
    assert [e[0] for e in log.newest(-1)] == [9, 7, 5]  # counter * workers + index
    assert len(log.newest(2)) == 2 and log.newest(0) == []
    log.configure(0, 1)  # shrinking drops the oldest at once
    assert [e[3][1] for e in log.newest(10)] == [b"4"]
    log.configure(0, 0)
    log.add([b"PING"], 5)  # slowlog-max-len 0 keeps nothing
    assert len(log.entries) == 0
    log.configure(-1, 10)
    assert log.min_ns == -1
    log.configure(10, 10)
    assert log.min_ns == 10_000


def test_arguments_are_cut_as_redis_does() -> None:
    log = SlowLog(0, 1)
    log.configure(0, 10)
    big = b"x" * (slowlog_arg_bytes_max + 5)
    log.add([b"ADDJOB", b"q", big, b"0"], 2500)
    entry = log.newest(1)[0]
    assert entry[2] == 2  # microseconds
    assert entry[3][2] == b"x" * slowlog_arg_bytes_max + b"... (5 more bytes)"
    log.add([b"ACKJOB"] + [b"id"] * 50, 1)
    args = log.newest(1)[0][3]
    assert len(args) == slowlog_args_max
    assert args[-1] == b"... (%d more arguments)" % (51 - slowlog_args_max + 1)


def test_merge_is_newest_first_and_bounded() -> None:
    a, b = SlowLog(0, 2), SlowLog(1, 2)
    for log in (a, b):
        log.configure(0, 10)
    a.entries.appendleft([0, 1_000_000, 1, [b"A"]])
    b.entries.appendleft([1, 3_000_000, 1, [b"B"]])
    a.entries.appendleft([2, 2_000_000, 1, [b"C"]])
    merged = merge([a.newest(-1), b.newest(-1)], 2)
    assert merged == [[1, 3, 1, [b"B"]], [2, 2, 1, [b"C"]]]
    assert len(merge([a.newest(-1), b.newest(-1)], -1)) == 3

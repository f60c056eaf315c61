"""disque_mp/node/config.py: the disque.conf parser, CONFIG GET/SET and CONFIG REWRITE."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disque_mp.node import config as c

# The reference's `CONFIG GET *` names, in its order (tests/reference/03).
REFERENCE_ORDER = [
    "requirepass", "unixsocket", "logfile", "pidfile", "maxmemory", "maxmemory-samples",
    "timeout", "auto-aof-rewrite-percentage", "auto-aof-rewrite-min-size",
    "slowlog-log-slower-than", "latency-monitor-threshold", "slowlog-max-len", "port",
    "tcp-backlog", "databases", "maxclients", "watchdog-period", "hz", "cluster-node-timeout",
    "tcp-keepalive", "no-appendfsync-on-rewrite", "daemonize", "activerehashing",
    "aof-rewrite-incremental-fsync", "aof-load-truncated", "aof-enqueue-jobs-once",
    "maxmemory-policy", "loglevel", "appendfsync", "syslog-facility", "appendonly", "dir",
    "client-output-buffer-limit", "unixsocketperm", "bind",
]
# Its values, except the paths that depend on the install (logfile, pidfile, dir).
REFERENCE_VALUES = {
    "requirepass": "", "unixsocket": "", "maxmemory": "1073741824", "maxmemory-samples": "5",
    "timeout": "0", "auto-aof-rewrite-percentage": "100", "auto-aof-rewrite-min-size": "67108864",
    "slowlog-log-slower-than": "10000", "latency-monitor-threshold": "0", "slowlog-max-len": "128",
    "port": "7711", "tcp-backlog": "511", "databases": "16", "maxclients": "10000",
    "watchdog-period": "0", "hz": "10", "cluster-node-timeout": "15000", "tcp-keepalive": "no",
    "no-appendfsync-on-rewrite": "no", "daemonize": "no", "activerehashing": "yes",
    "aof-rewrite-incremental-fsync": "yes", "aof-load-truncated": "yes",
    "aof-enqueue-jobs-once": "no", "maxmemory-policy": "acks", "loglevel": "notice",
    "appendfsync": "everysec", "syslog-facility": "local0", "appendonly": "no",
    "client-output-buffer-limit": "normal 0 0 0", "unixsocketperm": "0", "bind": "127.0.0.1",
}
# Deliberate differences from the reference's defaults (README, Limits).
REFERENCE_VALUES["client-output-buffer-limit"] = "normal 1073741824 268435456 60"


def fatal(text: str) -> c.ConfigError:
    with pytest.raises(c.ConfigError) as info:
        c.parse_text(text)
    return info.value


# --- splitting lines like sdssplitargs ---


@pytest.mark.parametrize(("line", "words"), [
    ("port 7711", ["port", "7711"]),
    ("  bind   127.0.0.1\t::1  ", ["bind", "127.0.0.1", "::1"]),
    ('logfile ""', ["logfile", ""]),
    ('requirepass "a b\\n\\x41\\"q"', ["requirepass", 'a b\nA"q']),
    ("requirepass 'it\\'s'", ["requirepass", "it's"]),
    ("requirepass 'no \\n escapes'", ["requirepass", "no \\n escapes"]),
    ('a"b c"', ["ab c"]),
    ("", []),
])
def test_split_args(line: str, words: list[str]) -> None:
    assert c.split_args(line) == words


@pytest.mark.parametrize("line", ['a "unterminated', "a 'open", 'a "x"y', "a 'x'y"])
def test_split_args_rejects_unbalanced_quotes(line: str) -> None:
    with pytest.raises(c.ArgsError):
        c.split_args(line)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_quote_round_trips(s: str) -> None:
    assert c.split_args(c.quote(s)) == [s]


# --- parsing the file ---


def test_defaults_match_the_reference_config_get() -> None:
    got = c.config_get(c.Config(), "*")
    names = [n for n, _ in got]
    assert names[: len(REFERENCE_ORDER)] == REFERENCE_ORDER
    values = dict(got)
    for name, value in REFERENCE_VALUES.items():
        assert values[name] == value, name
    assert {"workers", "appendfilename", "cluster-config-file"} <= set(names)


def test_every_config_field_is_a_directive() -> None:
    attrs = {d.attr for d in c.DIRECTIVES}
    assert {f.name for f in dataclasses.fields(c.Config)} - attrs == {"config_file"}


def test_parse_every_kind() -> None:
    cfg = c.parse_text(
        "# a comment\n"
        "\n"
        "PORT 7000\n"
        "bind 127.0.0.1 ::1\n"
        "maxmemory 2gb\n"
        "auto-aof-rewrite-min-size 100mb\n"
        "appendonly YES\n"
        "appendfsync always\n"
        "loglevel Verbose\n"
        'requirepass "s3cr3t pass"\n'
        "unixsocketperm 755\n"
        "client-output-buffer-limit normal 1mb 512kb 60\n"
        "workers 3\n"
        "client-query-buffer-limit 64mb\n"
        "proto-max-bulk-len 1k\n"
        "daemonize no\n"
        "port 7001\n"  # a later line wins
    )
    assert cfg.port == 7001
    assert cfg.bind == "127.0.0.1 ::1"
    assert cfg.maxmemory == 2 << 30
    assert cfg.auto_aof_rewrite_min_size == 100 << 20
    assert cfg.appendonly is True and cfg.appendfsync == "always"
    assert cfg.loglevel == "verbose"
    assert cfg.requirepass == "s3cr3t pass"
    assert cfg.unixsocketperm == 0o755
    assert cfg.client_output_buffer_limit == f"normal {1 << 20} {512 << 10} 60"
    assert cfg.workers == 3
    assert cfg.client_query_buffer_bytes_max == 64 << 20
    assert cfg.proto_max_bulk_len == 1000
    assert cfg.daemonize is False


@pytest.mark.parametrize(("text", "n"), [
    ("1", 1), ("1b", 1), ("1k", 1000), ("1kb", 1024), ("2m", 2_000_000), ("2MB", 2 << 20),
    ("1g", 10**9), ("1gb", 1 << 30),
])
def test_memory_units(text: str, n: int) -> None:
    assert c.parse_memory(text) == n


@pytest.mark.parametrize("text", ["", "gb", "1tb", "1.5gb", "one"])
def test_bad_memory_values(text: str) -> None:
    with pytest.raises(c.ConfigValueError):
        c.parse_memory(text)


def test_hz_is_clamped_like_disque() -> None:
    assert c.parse_text("hz 0").hz == 1
    assert c.parse_text("hz 100000").hz == 500


def test_fatal_error_names_the_line() -> None:
    err = fatal("port 7711\n# comment\nnot-a-directive 1\n")
    assert err.line_no == 3
    assert err.line == "not-a-directive 1"
    assert err.reason == "Bad directive or wrong number of arguments"
    report = err.report()
    assert "*** FATAL CONFIG FILE ERROR ***" in report
    assert "Reading the configuration file, at line 3" in report
    assert ">>> 'not-a-directive 1'" in report


@pytest.mark.parametrize(("line", "reason"), [
    ("port abc", "Invalid port"),
    ("port 70000", "Invalid port"),
    ("port 0", "Invalid port"),
    ("port", "Bad directive or wrong number of arguments"),
    ("port 1 2", "Bad directive or wrong number of arguments"),
    ("appendonly maybe", "argument must be 'yes' or 'no'"),
    ("appendfsync sometimes", "argument must be 'no', 'always' or 'everysec'"),
    ("loglevel loud", "Invalid log level. Must be one of debug, verbose, notice, warning"),
    ("maxmemory lots", "Invalid maxmemory value"),
    ("maxmemory 9999999999999gb", "Invalid maxmemory value"),
    ("timeout 99999999999999999999", "Invalid timeout value"),
    ("maxmemory-policy allkeys-lru", "Invalid maxmemory policy"),
    ("timeout -1", "Invalid timeout value"),
    ("maxclients 0", "Invalid max clients limit"),
    ("cluster-node-timeout 0", "cluster node timeout must be 1 or greater"),
    ("appendfilename dir/file.aof", "appendfilename can't be a path, just a filename"),
    ("requirepass " + "x" * 513, "Password is longer than REDIS_AUTHPASS_MAX_LEN"),
    ("unixsocketperm 999", "Invalid socket file permissions"),
    ("workers 0", "workers must be between 1 and 1024"),
    ("bind " + " ".join(["127.0.0.1"] * 17), "Too many bind addresses specified."),
    ('logfile "unterminated', "Unbalanced quotes in configuration line"),
])
def test_bad_values_stop_startup(line: str, reason: str) -> None:
    err = fatal(f"port 7711\n{line}\n")
    assert (err.line_no, err.line, err.reason) == (2, line, reason)


def test_daemonize_yes_points_to_systemd() -> None:
    err = fatal("daemonize yes")
    assert "daemonize yes is not supported" in err.reason
    assert "systemd" in err.reason


def test_load_file_then_command_line(tmp_path: Path) -> None:
    path = tmp_path / "disque.conf"
    path.write_text("port 7000\nloglevel warning\n")
    cfg = c.load(str(path), [["port", "7002"], ["bind", "127.0.0.1", "::1"]])
    assert (cfg.port, cfg.loglevel, cfg.bind) == (7002, "warning", "127.0.0.1 ::1")
    assert cfg.config_file == str(path)


def test_load_reports_file_and_command_line_errors(tmp_path: Path) -> None:
    path = tmp_path / "disque.conf"
    path.write_text("port 7000\nhz x\n")
    with pytest.raises(c.ConfigError) as info:
        c.load(str(path))
    assert info.value.source == str(path) and info.value.line_no == 2
    assert f"File: {path}" in info.value.report()
    with pytest.raises(c.ConfigError) as info:
        c.load(None, [["workers", "two"]])
    assert "Reading the command line" in info.value.report()
    assert ">>> '--workers two'" in info.value.report()
    with pytest.raises(c.ConfigError) as info:
        c.load(str(tmp_path / "missing.conf"))
    assert "can't open config file" in info.value.reason


def test_include(tmp_path: Path) -> None:
    (tmp_path / "common.conf").write_text("maxmemory 10mb\nport 7100\n")
    (tmp_path / "main.conf").write_text("include common.conf\nport 7200\n")
    cfg = c.load(str(tmp_path / "main.conf"))
    assert (cfg.maxmemory, cfg.port) == (10 << 20, 7200)
    (tmp_path / "bad.conf").write_text("port nope\n")
    (tmp_path / "main2.conf").write_text("include bad.conf\n")
    with pytest.raises(c.ConfigError) as info:
        c.load(str(tmp_path / "main2.conf"))
    assert info.value.source == str(tmp_path / "bad.conf") and info.value.line_no == 1


def test_include_cycle_is_bounded(tmp_path: Path) -> None:
    (tmp_path / "a.conf").write_text("include a.conf\n")
    with pytest.raises(c.ConfigError) as info:
        c.load(str(tmp_path / "a.conf"))
    assert "include nested deeper" in info.value.reason


# --- CONFIG GET / SET ---


def test_config_get_patterns() -> None:
    cfg = c.Config()
    assert c.config_get(cfg, "maxmemory") == [("maxmemory", "1073741824")]
    assert c.config_get(cfg, "MAXMEMORY") == [("maxmemory", "1073741824")]
    assert [n for n, _ in c.config_get(cfg, "maxmemory*")] == [
        "maxmemory", "maxmemory-samples", "maxmemory-policy"]
    assert c.config_get(cfg, "nosuch") == []
    assert c.config_get(cfg, "tcp-keepalive") == [("tcp-keepalive", "no")]  # the reference's quirk
    assert c.config_get(cfg, "p[^i]rt") == [("port", "7711")]


def test_config_set() -> None:
    cfg = c.Config()
    assert c.config_set(cfg, "maxmemory", "100mb") is None and cfg.maxmemory == 100 << 20
    assert c.config_set(cfg, "appendonly", "yes") is None and cfg.appendonly is True
    assert c.config_set(cfg, "aof-enqueue-jobs-once", "yes") is None
    assert c.config_set(cfg, "loglevel", "debug") is None and cfg.loglevel == "debug"
    assert c.config_set(cfg, "client-output-buffer-limit", "normal 10mb 5mb 30") is None
    assert cfg.client_output_buffer_limit == f"normal {10 << 20} {5 << 20} 30"
    assert c.config_set(cfg, "maxmemory", "lots") == "Invalid argument 'lots' for CONFIG SET 'maxmemory'"
    assert c.config_set(cfg, "notaconfig", "1") == "Unsupported CONFIG parameter: notaconfig"
    assert c.config_set(cfg, "port", "7000") == "Unsupported CONFIG parameter: port"
    assert c.config_set(cfg, "workers", "4") == "Unsupported CONFIG parameter: workers"
    assert cfg.maxmemory == 100 << 20 and cfg.port == 7711


def test_config_set_dir_changes_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    cfg = c.Config()
    assert c.config_set(cfg, "dir", str(tmp_path / "sub")) is None
    assert os.getcwd() == str(tmp_path / "sub") == cfg.dir
    err = c.config_set(cfg, "dir", str(tmp_path / "missing"))
    assert err == f"Invalid argument '{tmp_path / 'missing'}' for CONFIG SET 'dir'"
    assert os.getcwd() == str(tmp_path / "sub")


# --- CONFIG REWRITE ---

ORIGINAL = """\
# My node
port 7711
# memory
maxmemory 1gb
include extra.conf
appendonly no
appendonly no
"""


def test_rewrite_keeps_comments_updates_in_place_appends_new() -> None:
    cfg = c.parse_text("port 7711\nmaxmemory 1gb\nappendonly no\n")
    c.config_set(cfg, "maxmemory", "2gb")
    c.config_set(cfg, "appendonly", "yes")
    c.config_set(cfg, "requirepass", 'pa"ss')
    out = c.rewrite_text(cfg, ORIGINAL)
    assert out.splitlines() == [
        "# My node",
        "port 7711",
        "# memory",
        "maxmemory 2gb",
        "include extra.conf",
        "appendonly yes",  # the duplicate below is dropped: it would override
        c.REWRITE_MARKER,
        'requirepass "pa\\"ss"',
    ]


def test_rewrite_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "disque.conf"
    path.write_text("# keep me\nport 7300\n")
    path.chmod(0o640)
    cfg = c.load(str(path))
    for name, value in [("maxmemory", "123456"), ("loglevel", "warning"),
                        ("requirepass", "a b 'c'"), ("tcp-keepalive", "60"),
                        ("client-output-buffer-limit", "normal 1mb 1mb 10")]:
        assert c.config_set(cfg, name, value) is None
    c.rewrite(cfg)
    text = path.read_text()
    assert text.startswith("# keep me\nport 7300\n")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    again = c.load(str(path))
    assert again == cfg
    c.rewrite(again)  # a second rewrite changes nothing
    assert path.read_text() == text


def test_rewrite_without_a_config_file_fails() -> None:
    with pytest.raises(OSError):
        c.rewrite(c.Config())


def test_format_memory() -> None:
    assert [c.format_memory(n) for n in (0, 1, 1024, 1 << 20, 3 << 30, 1500)] == [
        "0", "1", "1kb", "1mb", "3gb", "1500"]


def test_the_example_config_is_valid() -> None:
    path = Path(__file__).resolve().parents[2] / "systemd" / "disque-mp.conf"
    cfg = c.load(str(path))
    assert (cfg.port, cfg.bind, cfg.dir) == (7711, "127.0.0.1", "/var/lib/disque-mp")
    assert cfg.appendonly is True and cfg.logfile == "" and cfg.daemonize is False


# --- bad input never escapes as anything but the documented errors ---

_names = st.sampled_from([d.name for d in c.DIRECTIVES] + ["include", "nosuch", "PORT"])
_values = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "yes", "no", "-1", "0", "1gb", "9" * 5000, "1" * 5000 + "kb",
                     "a\0b", '"x', "'", "normal 1 2", "normal 1 2 3 4"]),
)


@given(st.lists(st.tuples(_names, _values), max_size=5))
def test_any_config_text_parses_or_fails_with_a_config_error(lines: list[tuple[str, str]]) -> None:
    text = "\n".join(f"{name} {value}" for name, value in lines)
    try:
        c.parse_text(text)
    except c.ConfigError as e:
        assert e.line_no >= 1 and e.reason


@given(_names, _values)
def test_config_set_never_raises(name: str, value: str) -> None:
    cwd = os.getcwd()
    try:
        result = c.config_set(c.Config(), name, value)
    finally:
        os.chdir(cwd)  # a valid `dir` changes directory, as Disque does
    assert result is None or isinstance(result, str)


def test_worker_ports_base(tmp_path: Path) -> None:
    cfg = c.parse_text("workers 3\nport 7711\n")
    assert cfg.worker_ports_base == 0 and c.worker_ports(cfg) == []
    assert c.config_get(cfg, "worker-ports-base") == [("worker-ports-base", "0")]
    cfg = c.parse_text("workers 3\nworker-ports-base 7800\n")
    assert c.worker_ports(cfg) == [7800, 7801, 7802]
    assert c.check_worker_ports(cfg) == ""
    assert c.config_get(cfg, "worker-ports-base") == [("worker-ports-base", "7800")]
    # a start-up directive, like port
    assert c.config_set(cfg, "worker-ports-base", "7900") == \
        "Unsupported CONFIG parameter: worker-ports-base"
    for bad in ("-1", "65536", "x"):
        with pytest.raises(c.ConfigError, match="Invalid worker-ports-base"):
            c.parse_text(f"worker-ports-base {bad}")
    path = tmp_path / "d.conf"
    for text, reason in (("port 7801", "port 7801 is one of the worker ports 7800-7802"),
                         ("tls-port 7802", "tls-port 7802 is one of"),
                         ("port 17711\nworker-ports-base 27710", "the cluster bus port 27711"),
                         ("worker-ports-base 65534", "goes past port 65535")):
        path.write_text(f"workers 3\nworker-ports-base 7800\n{text}\n")
        with pytest.raises(c.ConfigError, match=reason):
            c.load(str(path))
    path.write_text("workers 3\nworker-ports-base 7800\n")
    assert c.worker_ports(c.load(str(path), [["workers", "2"]])) == [7800, 7801]

"""Logging for the supervisor and the workers, in Redis' log line format.

    12345:X 21 Nov 23:59:01.123 * Ready to accept connections

``pid:role`` (role ``X`` = supervisor, ``W0``..``Wn`` = workers), the local
time with milliseconds, a level mark (``.`` debug, ``-`` verbose, ``*``
notice, ``#`` warning) and the message. Every process calls
``setup_logging(cfg, role)`` once (again after a fork); modules log with
``logging.getLogger(__name__)``: ``log.info`` is Disque's notice level,
``log.log(VERBOSE, ...)`` its verbose level. ``logformat json`` writes one JSON
object a line instead (``JsonFormatter``), for log pipelines that parse JSON.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import os
import sys
import time
from typing import TextIO

from disque_mp.node.config import Config

VERBOSE = 15  # between DEBUG and INFO, as Disque's "verbose"
LEVELS = {"debug": logging.DEBUG, "verbose": VERBOSE, "notice": logging.INFO,
          "warning": logging.WARNING}
logging.addLevelName(VERBOSE, "VERBOSE")
_handler_tag = "_disque_mp_handler"  # marks the handlers setup_logging installed


def _mark(levelno: int) -> str:
    if levelno >= logging.WARNING:
        return "#"
    if levelno >= logging.INFO:
        return "*"
    return "-" if levelno >= VERBOSE else "."


class RedisFormatter(logging.Formatter):
    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        ms = int((record.created % 1) * 1000)
        stamp = time.strftime("%d %b %H:%M:%S", time.localtime(record.created))
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return f"{record.process}:{self.role} {stamp}.{ms:03d} {_mark(record.levelno)} {text}"


class JsonFormatter(logging.Formatter):
    """``logformat json``: one JSON object a line, the same facts as the text line.

        {"ts": "2026-11-21T23:59:01.123Z", "pid": 12345, "role": "X",
         "level": "notice", "logger": "disque_mp.node.supervisor",
         "msg": "Ready to accept connections (4 workers)"}

    ``ts`` is UTC (RFC 3339, milliseconds); ``level`` is Disque's level name; a
    traceback, when there is one, is in ``exc``."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        ms = int((record.created % 1) * 1000)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, object] = {
            "ts": f"{stamp}.{ms:03d}Z", "pid": record.process, "role": self.role,
            "level": _level_name(record.levelno), "logger": record.name,
            "msg": record.getMessage()}
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def _level_name(levelno: int) -> str:
    if levelno >= logging.WARNING:
        return "warning"
    if levelno >= logging.INFO:
        return "notice"
    return "verbose" if levelno >= VERBOSE else "debug"


def _stream_handler(stream: TextIO) -> logging.Handler:
    return logging.StreamHandler(stream)


def _syslog_handler(cfg: Config) -> logging.Handler | None:
    if not os.path.exists("/dev/log"):
        return None
    facility = logging.handlers.SysLogHandler.facility_names.get(cfg.syslog_facility, 16)
    h = logging.handlers.SysLogHandler("/dev/log", facility)
    h.ident = f"{cfg.syslog_ident}[{os.getpid()}]: "
    return h


def setup_logging(cfg: Config, role: str) -> None:
    """(Re)configure the root logger for this process. Idempotent.

    ``logfile`` is relative to ``dir`` (the supervisor changed into it) and
    opened in append mode by every process: each record is one short write
    to an O_APPEND file, so lines of different processes do not interleave.
    Raises OSError when the log file cannot be opened.
    """
    handlers: list[logging.Handler] = []
    if cfg.logfile:
        handlers.append(logging.FileHandler(cfg.logfile, mode="a", encoding="utf-8"))
    else:
        handlers.append(_stream_handler(sys.stdout))
    if cfg.syslog_enabled:
        sh = _syslog_handler(cfg)
        if sh is not None:
            handlers.append(sh)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, _handler_tag, False):
            root.removeHandler(old)
            old.close()
    for h in handlers:
        json_lines = cfg.logformat == "json" and not isinstance(h, logging.handlers.SysLogHandler)
        h.setFormatter(JsonFormatter(role) if json_lines else RedisFormatter(role))
        setattr(h, _handler_tag, True)
        root.addHandler(h)
    set_loglevel(cfg.loglevel)


def set_loglevel(name: str) -> None:
    """Apply a ``loglevel`` value (CONFIG SET loglevel calls this too)."""
    logging.getLogger().setLevel(LEVELS.get(name, logging.INFO))

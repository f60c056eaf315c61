"""Celery beat entries as node SCHEDULEs: beat is no longer a process that must stay up.

    celery -A proj beat -S disque_mp.kombu.beat:DisqueScheduler

``DisqueScheduler`` reads ``beat_schedule`` (and the entries Celery adds itself,
such as ``celery.backend_cleanup`` when a result backend wants it) and makes each
entry a ``SCHEDULE`` on the Disque cluster of the app's ``disque://`` broker:

- the task message is built once, as ``apply_async`` builds it (the entry's task,
  args, kwargs and options: queue, routing, priority), and published through
  the transport's own mapping (``Channel.job_for``: queue, RETRY from the
  visibility timeout, TTL, GROUP, DEDUP ...), so a firing is the ADDJOB
  ``app.send_task`` would have sent;
- ``crontab`` entries become ``CRON "m h dom mon dow" TZ <zone>`` (the app's
  ``timezone``, UTC by default); ``schedule(run_every=...)`` / a timedelta / a
  number of seconds becomes ``EVERY <seconds>`` (whole seconds, at least 1); any
  other schedule (``solar``, a custom class) is refused with a warning and left out;
- the schedules are named ``celery-beat:<entry name>``; one of that prefix that
  is no longer an entry is deleted (``SCHEDULE DEL``), so removing an entry from
  the config and running beat again removes it from the cluster.

The sync runs when beat starts; after it the scheduler sends nothing: every node
knows the schedules and one of them fires each time (docs/extensions.md,
"Schedules"), so beat may stop (run it again after changing ``beat_schedule``). Since the message is fixed when the schedule is set, every
firing of an entry carries the same task ID; each firing is its own job (with
the ``dedup`` transport option its DEDUP key is ``<task id>@<fire time>``).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from celery.beat import ScheduleEntry, Scheduler
from celery.schedules import crontab, schedule

from disque_mp.client.core import AddJobOptions
from disque_mp.kombu.transport import Channel, Transport

log = logging.getLogger("disque_mp.kombu.beat")

NAME_PREFIX = "celery-beat:"


def rule_of(entry: ScheduleEntry, default_tz: str) -> dict[str, Any] | None:
    """The SCHEDULE rule of a beat entry (``cron=`` and ``tz=``, or ``every=``),
    or None for one a node cannot run."""
    s = entry.schedule
    if isinstance(s, crontab):
        fields = ((s.minute, 0, 59), (s.hour, 0, 23), (s.day_of_month, 1, 31),
                  (s.month_of_year, 1, 12), (s.day_of_week, 0, 6))
        expr = " ".join(_cron_field(values, lo, hi) for values, lo, hi in fields)
        return {"cron": expr, "tz": str(getattr(s, "tz", None) or default_tz)}
    if type(s) is schedule:  # a subclass (solar, an app's own) fires at other times
        seconds = s.run_every.total_seconds()
    elif isinstance(s, timedelta):
        seconds = s.total_seconds()
    elif isinstance(s, (int, float)):
        seconds = float(s)
    else:
        return None
    if seconds < 1 or seconds != int(seconds):
        return None
    return {"every": int(seconds)}


def _cron_field(values: set[int], lo: int, hi: int) -> str:
    """One field from crontab's expanded set (Sunday is 0 in both)."""
    if set(values) >= set(range(lo, hi + 1)):
        return "*"
    return ",".join(str(v) for v in sorted(values))


class _Capture(Exception):
    """Raised by the capturing channel with the ADDJOB a publish would send."""

    def __init__(self, job: tuple[str, str, AddJobOptions]) -> None:
        super().__init__("captured")
        self.job = job


class _CaptureChannel(Channel):
    """A channel whose publish hands back the ADDJOB instead of sending it."""

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        raise _Capture(self.job_for(queue, message))


class _CaptureTransport(Transport):
    Channel = _CaptureChannel


def job_of_entry(app: Any, entry: ScheduleEntry) -> tuple[str, str, AddJobOptions]:
    """The ADDJOB (queue, body, options) ``entry`` would publish, without publishing."""
    with app.connection_for_write(transport=_CaptureTransport) as conn:
        try:
            app.send_task(entry.task, args=entry.args, kwargs=entry.kwargs, connection=conn,
                          retry=False, **(entry.options or {}))
        except _Capture as got:
            return got.job
    raise RuntimeError(f"beat entry {entry.name!r} published no message")


class DisqueScheduler(Scheduler):
    """A beat scheduler whose entries run as SCHEDULEs on the Disque nodes."""

    def setup_schedule(self) -> None:
        self.install_default_entries(self.data)
        self.merge_inplace(self.app.conf.beat_schedule)
        self.sync_to_disque()

    def sync_to_disque(self) -> list[str]:
        """Make every entry a SCHEDULE and delete our stale ones; the names set."""
        default_tz = str(self.app.conf.timezone or "UTC")
        names: list[str] = []
        with self.app.connection_for_write() as conn:
            client = conn.default_channel.client
            if not isinstance(conn.default_channel, Channel):
                raise TypeError("DisqueScheduler needs the app's broker to be disque://")
            for entry in self.schedule.values():
                rule = rule_of(entry, default_tz)
                if rule is None:
                    log.warning("beat entry %r: its schedule %r cannot run as a SCHEDULE "
                                "(crontab or a whole number of seconds can); left out",
                                entry.name, entry.schedule)
                    continue
                queue, body, options = job_of_entry(self.app, entry)
                name = NAME_PREFIX + entry.name
                client.schedule(name, queue, body, **rule, **options)
                names.append(name)
            for old in client.execute("SCHEDULE", "LIST"):
                text = old.decode("utf-8", "surrogateescape")
                if text.startswith(NAME_PREFIX) and text not in names:
                    client.unschedule(old)
        log.info("beat: %d entries are SCHEDULEs on the Disque cluster: %s", len(names),
                 ", ".join(names))
        return names

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Nothing to send: the nodes fire."""
        return float(self.max_interval)

    @property
    def info(self) -> str:
        return "    . entries run as SCHEDULEs on the Disque nodes (disque_mp.kombu.beat)"

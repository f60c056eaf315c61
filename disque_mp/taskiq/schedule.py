"""A Taskiq schedule source whose schedules are node SCHEDULEs.

    broker = DisqueBroker("disque://127.0.0.1:7711", queue="tasks")
    source = DisqueScheduleSource(broker)
    scheduler = TaskiqScheduler(broker, sources=[source])   # taskiq scheduler mod:scheduler

    await source.add_schedule(ScheduledTask(task_name="mod:report", labels={}, args=[],
                                            kwargs={}, cron="*/5 * * * *"))

The nodes fire: every schedule is a ``SCHEDULE`` named ``taskiq:<schedule_id>``
whose ADDJOB is the one ``kiq()`` would send (the message ``broker.formatter``
makes, the queue and options of ``DisqueBroker.job_for``), so ``get_schedules``
answers nothing to Taskiq's scheduler (it would send each task a second time) and
the scheduler process need not stay up. At ``startup`` the source makes
SCHEDULEs of the tasks' ``schedule`` labels (as ``LabelScheduleSource`` reads
them; such a label needs a ``schedule_id`` so that a restart replaces the same
schedule rather than adding one) and, with ``prune=True``, deletes the
``taskiq:`` SCHEDULEs that neither a label nor ``add_schedule`` made in this run.

Rules: ``cron`` (5 fields; ``cron_offset`` a zone name, UTC by default) becomes
``CRON``; ``interval`` (whole seconds or a timedelta) becomes ``EVERY``; a one-off
``time`` is refused (``ValueError``): it is an ADDJOB with DELAY, not a schedule.
The message is fixed when the schedule is set: every firing carries its task ID.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from datetime import timedelta
from typing import Any

from taskiq import AckableMessage, AsyncBroker, BrokerMessage, ScheduledTask, ScheduleSource
from taskiq.kicker import AsyncKicker

from disque_mp.taskiq.broker import DisqueBroker

log = logging.getLogger("disque_mp.taskiq.schedule")

NAME_PREFIX = "taskiq:"


def rule_of(task: ScheduledTask) -> dict[str, Any]:
    """SCHEDULE's rule for ``task`` (``cron=`` and ``tz=``, or ``every=``)."""
    if task.cron is not None:
        offset = task.cron_offset
        if offset is not None and not isinstance(offset, str):
            raise ValueError("cron_offset must be a zone name (a SCHEDULE's TZ) here")
        return {"cron": task.cron, "tz": offset or "UTC"}
    if task.interval is not None:
        seconds = task.interval.total_seconds() if isinstance(task.interval, timedelta) \
            else float(task.interval)
        return {"every": int(seconds)}
    raise ValueError("a one-off time is an ADDJOB with DELAY, not a SCHEDULE")


class _CaptureBroker(AsyncBroker):
    """Takes the message ``kiq()`` kicks (formatted and passed through the real
    broker's middlewares, as a kick would be) instead of sending it."""

    def __init__(self, real: DisqueBroker) -> None:
        super().__init__(task_id_generator=real.id_generator)
        self.formatter = real.formatter
        self.middlewares = real.middlewares
        self.captured: list[BrokerMessage] = []

    async def kick(self, message: BrokerMessage) -> None:
        self.captured.append(message)

    async def listen(self) -> AsyncGenerator[bytes | AckableMessage, None]:
        raise NotImplementedError("a capturing broker receives nothing")
        yield b""  # an async generator, as AsyncBroker.listen is


class DisqueScheduleSource(ScheduleSource):
    """Taskiq schedules kept and fired by the Disque nodes of ``broker``."""

    def __init__(self, broker: DisqueBroker, *, prune: bool = False) -> None:
        self.broker = broker
        self.prune = prune
        self.set_here: set[str] = set()

    async def startup(self) -> None:
        for task_name, task in self.broker.get_all_tasks().items():
            for entry in task.labels.get("schedule", []):
                if "schedule_id" not in entry:
                    log.warning("task %s: a schedule label without schedule_id is left out "
                                "(a restart would add it again)", task_name)
                    continue
                labels = {k: v for k, v in task.labels.items() if k != "schedule"}
                labels.update(entry.get("labels", {}))
                await self.add_schedule(ScheduledTask(
                    task_name=task_name, labels=labels, schedule_id=entry["schedule_id"],
                    args=entry.get("args", []), kwargs=entry.get("kwargs", {}),
                    cron=entry.get("cron"), cron_offset=entry.get("cron_offset"),
                    interval=entry.get("interval"), time=entry.get("time")))
        if self.prune:
            for name in await self.broker.client.execute("SCHEDULE", "LIST"):
                text = name.decode("utf-8", "surrogateescape")
                if text.startswith(NAME_PREFIX) and text not in self.set_here:
                    await self.broker.client.unschedule(name)

    async def get_schedules(self) -> list[ScheduledTask]:
        return []  # the nodes fire them: Taskiq's scheduler must not send them too

    async def add_schedule(self, schedule: ScheduledTask) -> None:
        rule = rule_of(schedule)
        capture = _CaptureBroker(self.broker)
        kicker: AsyncKicker[Any, Any] = AsyncKicker(schedule.task_name, capture,
                                                    schedule.labels)
        kicker = kicker.with_labels(schedule_id=schedule.schedule_id)
        if schedule.task_id is not None:
            kicker = kicker.with_task_id(schedule.task_id)
        await kicker.kiq(*schedule.args, **schedule.kwargs)
        queue, body, options = self.broker.job_for(capture.captured[-1])
        name = NAME_PREFIX + schedule.schedule_id
        await self.broker.client.schedule(name, queue, body, **rule, **options)
        self.set_here.add(name)

    async def delete_schedule(self, schedule_id: str) -> None:
        await self.broker.client.unschedule(NAME_PREFIX + schedule_id)
        self.set_here.discard(NAME_PREFIX + schedule_id)

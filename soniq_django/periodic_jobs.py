"""``@periodic``: schedules defined in code, and the timing rules of every schedule.

``@periodic(every=timedelta(minutes=15))`` or ``@periodic(cron="*/5 * * * *")``
goes on top of a ``@job(name=...)`` handler. It records a :class:`PeriodicSchedule`
in an in-process registry keyed by job name; the scheduler writes these to
``soniq_recurring_jobs`` when it starts (see ``soniq_django.scheduler``).

:class:`Timing` reads a row's ``schedule_type``/``schedule_value`` pair, for
code schedules and hand-inserted rows alike. Cron expressions have exactly five
fields and are evaluated in UTC.
"""

import datetime as dt
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, TypeVar

from croniter import croniter
from django.core.exceptions import ImproperlyConfigured

from .conf import checked
from .errors import SettingsInvalid, SoniqError
from .producer.request import INT32_MAX, JobRequest, prepare
from .registry import JobHandler

_schedules: dict[str, "PeriodicSchedule"] = {}
_UNSET: Any = object()
HandlerT = TypeVar("HandlerT", bound="JobHandler[..., Any]")
# The values of models.ScheduleType, spelled out so that importing this
# module never needs the app registry.
INTERVAL, CRON = "interval", "cron"


@dataclass(frozen=True)
class Timing:
    """When a schedule fires: ``interval`` (whole seconds) or five-field ``cron`` (UTC)."""

    kind: str
    value: str

    @classmethod
    def parse(cls, kind: Any, value: Any) -> "Timing":
        """Return the timing of a ``schedule_type``/``schedule_value`` pair.

        The value is normalized (``" 900 "`` → ``"900"``, cron whitespace
        collapsed). Raises ``ValueError`` with a readable reason when invalid.
        """
        if type(value) is not str:
            raise ValueError("schedule_value must be text")
        if kind == INTERVAL:
            return cls(kind, str(_interval_seconds(value)))
        if kind == CRON:
            return cls(kind, _cron_expression(value))
        raise ValueError("schedule_type must be 'interval' or 'cron'")

    @property
    def seconds(self) -> int:
        """The interval in seconds (interval timings only)."""
        return int(self.value)

    def first_run(self, now: dt.datetime, last_run: dt.datetime | None = None) -> dt.datetime:
        """``next_run`` for a row that has none.

        Interval: one interval after ``last_run``, or ``now`` (due at once)
        for a row that never ran. Cron: the first fire time after ``now``.
        """
        if self.kind == INTERVAL:
            if last_run is None:
                return now
            return last_run + dt.timedelta(seconds=self.seconds)
        return self._cron_after(now)

    def next_after(self, tick: dt.datetime, now: dt.datetime) -> dt.datetime:
        """The fire time after ``tick`` (just run at ``now``), skipping ticks already missed.

        Interval: the first ``tick + k * interval`` later than ``now``, so the
        cadence keeps its phase. Cron: the first fire time after ``now``.
        """
        if self.kind == INTERVAL:
            step = dt.timedelta(seconds=self.seconds)
            if tick > now:
                return tick + step
            return tick + step * ((now - tick) // step + 1)
        return self._cron_after(max(tick, now))

    def _cron_after(self, moment: dt.datetime) -> dt.datetime:
        following: dt.datetime = croniter(self.value, moment.astimezone(dt.UTC)).get_next(
            dt.datetime)
        return following


def _interval_seconds(value: str) -> int:
    text = value.strip()
    if not text.isdigit() or not 1 <= int(text) <= INT32_MAX:
        raise ValueError("an interval is a whole number of seconds, at least 1, as text")
    return int(text)


def _cron_expression(value: str) -> str:
    fields = value.split()
    if len(fields) != 5:
        raise ValueError("a cron expression has exactly five fields: minute hour day month weekday")
    expression = " ".join(fields)
    try:
        # is_valid() accepts some expressions get_next() cannot serve
        # (e.g. a 31st of February), so compute one fire time instead.
        croniter(expression, dt.datetime(2000, 1, 1, tzinfo=dt.UTC)).get_next(dt.datetime)
    except Exception:  # croniter raises several unrelated types
        raise ValueError("the cron expression is not valid") from None
    return expression


@dataclass(frozen=True)
class PeriodicSchedule:
    """A schedule defined in code for one ``@job`` handler."""

    handler: JobHandler[..., Any]
    timing: Timing
    args: dict[str, Any]
    queue: str | None
    priority: int | None
    max_attempts: Any

    @property
    def job_name(self) -> str:
        return self.handler.name

    def row_values(self) -> dict[str, Any]:
        """The ``soniq_recurring_jobs`` columns code owns, with settings resolved now.

        Raises ``SettingsInvalid`` when a setting it needs is one the checks reject.
        """
        queue = next((q for q in (self.queue, self.handler.queue) if q is not None), None)
        if queue is None:
            queue = checked("DEFAULT_QUEUE")
        priority = self.priority if self.priority is not None else checked("DEFAULT_PRIORITY")
        max_attempts = (
            self.handler.max_attempts if self.max_attempts is _UNSET else self.max_attempts
        )
        return {
            "schedule_type": self.timing.kind,
            "schedule_value": self.timing.value,
            "job_kwargs": self.args,
            "queue": queue,
            "priority": priority,
            "max_attempts": max_attempts,
        }


def code_schedules() -> dict[str, PeriodicSchedule]:
    """A copy of the schedules defined in code in this process: job name → schedule."""
    return dict(_schedules)


def periodic(*, cron: str | None = None, every: dt.timedelta | int | None = None,
             args: dict[str, Any] | None = None, queue: str | None = None,
             priority: int | None = None, max_attempts: Any = _UNSET
             ) -> Callable[[HandlerT], HandlerT]:
    """Run a ``@job`` handler on a schedule: ``@periodic(cron=...)`` or ``@periodic(every=...)``.

    ``every`` is a ``timedelta`` or a number of seconds (whole, at least 1).
    ``args`` are the keyword arguments of every run; ``queue``, ``priority``
    and ``max_attempts`` default to the handler's and the settings'. Returns
    the handler unchanged. Raises ``ImproperlyConfigured`` for anything invalid,
    at decoration time -- except the settings: a schedule that needs a
    setting the system checks reject is checked against it when the
    scheduler writes it (``manage.py check`` reports the setting).
    """
    timing = _timing(cron, every)

    def decorate(handler: HandlerT) -> HandlerT:
        if not isinstance(handler, JobHandler):
            raise ImproperlyConfigured(
                "@periodic goes on top of @job(name=...): stack it above the @job line"
            )
        schedule = PeriodicSchedule(handler, timing, dict(args or {}), queue, priority,
                                    max_attempts)
        _check_runnable(schedule)
        _register(schedule)
        return handler

    return decorate


def _timing(cron: Any, every: Any) -> Timing:
    if (cron is None) == (every is None):
        raise ImproperlyConfigured("@periodic takes exactly one of cron= or every=")
    if isinstance(every, dt.timedelta):
        if every % dt.timedelta(seconds=1):
            raise ImproperlyConfigured("@periodic(every=...) must be whole seconds")
        every = every // dt.timedelta(seconds=1)
    if every is not None and type(every) is not int:
        raise ImproperlyConfigured("@periodic(every=...) takes a timedelta or whole seconds")
    kind, value = (CRON, cron) if cron is not None else (INTERVAL, str(every))
    try:
        return Timing.parse(kind, value)
    except ValueError as error:
        raise ImproperlyConfigured(f"@periodic: {error}") from None


def _check_runnable(schedule: PeriodicSchedule) -> None:
    # Fail at import time, not at 3 a.m.: the args must fit the handler and
    # the row must pass the same checks enqueue() makes. A bad setting is not
    # this decorator's to raise: importing a module must not fail because of
    # it (apps.ready() imports every jobs module before `manage.py check`
    # could say what is wrong). The checks report it (soniq.E003/E004), the
    # scheduler does not start while they fail, and enqueue() names it.
    try:
        schedule.handler.bind_kwargs((), schedule.args)
        values = schedule.row_values()
        prepare(JobRequest(schedule.job_name, schedule.args, queue=values["queue"],
                           priority=values["priority"], max_attempts=values["max_attempts"]))
    except SettingsInvalid:
        return
    except SoniqError as error:
        raise ImproperlyConfigured(f"@periodic on {schedule.job_name}: {error.reason}") from None


def _register(schedule: PeriodicSchedule) -> None:
    # One schedule per job name (the table is keyed by it). Registering the
    # same schedule again, as a re-imported module does, is harmless;
    # a second, different one is a mistake worth stopping at import time.
    current = _schedules.get(schedule.job_name)
    if current is not None and _identity(current) != _identity(schedule):
        raise ImproperlyConfigured(
            f"The job {schedule.job_name!r} already has a different @periodic schedule"
        )
    _schedules[schedule.job_name] = schedule


def _identity(schedule: PeriodicSchedule) -> tuple[Any, ...]:
    func = schedule.handler.func
    return (f"{func.__module__}.{func.__qualname__}", schedule.timing, schedule.args,
            schedule.queue, schedule.priority, schedule.max_attempts)

"""The scheduler: @periodic, soniq_recurring_jobs rows, timing, and exactly-once ticks."""

import datetime as dt
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection
from django.utils import timezone

from soniq_django import job, periodic, periodic_jobs, registry
from soniq_django.models import Job, RecurringJob
from soniq_django.scheduler import Scheduler, tick_dedup_key
from tests.support.concurrency import run_threads

T0 = dt.datetime(2030, 1, 1, 10, 0, tzinfo=dt.UTC)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def private_registries(monkeypatch):
    # Schedules made here must not leak into other tests' schedulers.
    monkeypatch.setattr(periodic_jobs, "_schedules", {})
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


def scheduled_job(name, **options):
    """A no-op ``@job(name=name)`` handler with ``@periodic(**options)`` on top."""

    @periodic(**options)
    @job(name=name, queue="sched", retries=1)
    def handler(**kwargs):
        return kwargs

    return handler


def row(job_name, *, value="60", kind="interval", **fields):
    return RecurringJob.objects.create(
        job_name=job_name, schedule_type=kind, schedule_value=value, **fields
    )


def insert_by_hand(job_name, kind, value, kwargs_json="{}"):
    """The seed's raw INSERT: id, job_name, schedule_type, schedule_value, job_kwargs only."""
    row_id = RecurringJob._meta.get_field("id").get_db_prep_value(uuid.uuid4(), connection)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO soniq_recurring_jobs (id, job_name, schedule_type, schedule_value, "
            f"job_kwargs) VALUES (%s, %s, %s, %s, '{kwargs_json}')",
            [row_id, job_name, kind, value],
        )


def jobs_of(job_name):
    return list(Job.objects.filter(job_name=job_name).order_by("created_at"))


# -- @periodic ---------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {},
    {"cron": "* * * * *", "every": 60},
    {"every": 0},
    {"every": -5},
    {"every": 1.5},
    {"every": True},
    {"every": dt.timedelta(milliseconds=1500)},
    {"every": dt.timedelta(0)},
    {"cron": "* * * *"},
    {"cron": "0 * * * * *"},
    {"cron": "@daily"},
    {"cron": "61 * * * *"},
    {"cron": "0 0 31 2 *"},
    {"cron": "every day"},
])
def test_periodic_refuses_a_bad_timing_when_decorating(options):
    with pytest.raises(ImproperlyConfigured):
        scheduled_job("sched.bad_timing", **options)


@pytest.mark.parametrize("options", [
    {"every": 60, "args": {"unknown": 1}},          # does not bind to the signature
    {"every": 60, "args": {"when": T0}},            # not JSON
    {"every": 60, "max_attempts": 0},
    {"every": 60, "queue": ""},
    {"every": 60, "priority": "high"},
])
def test_periodic_refuses_a_schedule_that_could_never_be_enqueued(options):
    @job(name="sched.strict")
    def strict(n: int = 0):
        return n

    with pytest.raises(ImproperlyConfigured):
        periodic(**options)(strict)


def test_periodic_goes_on_top_of_a_job_handler_and_returns_it():
    def plain():
        pass

    with pytest.raises(ImproperlyConfigured, match="@job"):
        periodic(every=60)(plain)
    handler = job(name="sched.plain")(plain)
    assert periodic(every=60)(handler) is handler
    assert periodic_jobs.code_schedules()["sched.plain"].handler is handler


def test_one_schedule_per_job_name():
    handler = scheduled_job("sched.once", every=60)
    periodic(every=60)(handler)  # the same schedule again (a re-import) is fine
    with pytest.raises(ImproperlyConfigured, match="different"):
        periodic(cron="0 * * * *")(handler)


def test_timings_are_normalized():
    scheduled_job("sched.minutes", every=dt.timedelta(minutes=15))
    scheduled_job("sched.seconds", every=30)
    scheduled_job("sched.cron", cron="  */5   * * * * ")
    found = {name: s.timing.value for name, s in periodic_jobs.code_schedules().items()}
    assert found == {"sched.minutes": "900", "sched.seconds": "30", "sched.cron": "*/5 * * * *"}


# -- code schedules in the table ---------------------------------------------


@pytest.mark.django_db
def test_code_schedules_are_written_with_their_options():
    scheduled_job("sched.every", every=dt.timedelta(minutes=15), args={"n": 1}, priority=5)
    scheduled_job("sched.yearly", cron="0 0 1 1 *", queue="reports", max_attempts=None)
    before = timezone.now()
    assert Scheduler().sync_code_schedules() == ["sched.every", "sched.yearly"]
    every = RecurringJob.objects.get(job_name="sched.every")
    yearly = RecurringJob.objects.get(job_name="sched.yearly")
    assert (every.schedule_type, every.schedule_value, every.job_kwargs) == ("interval", "900",
                                                                             {"n": 1})
    assert (every.queue, every.priority, every.max_attempts) == ("sched", 5, 2)  # retries=1
    assert (every.status, every.run_count) == ("active", 0)
    assert before <= every.next_run <= timezone.now()  # a new interval schedule is due at once
    assert (yearly.schedule_type, yearly.schedule_value) == ("cron", "0 0 1 1 *")
    assert (yearly.queue, yearly.max_attempts) == ("reports", None)
    assert yearly.next_run == dt.datetime(before.year + 1, 1, 1, tzinfo=dt.UTC)


@pytest.mark.django_db
def test_code_schedules_are_rewritten_but_status_and_history_are_kept():
    scheduled_job("sched.kept", every=60, args={"v": 2})
    scheduled_job("sched.retimed", cron="0 9 * * *")
    job_id = uuid.uuid4()
    kept = row("sched.kept", value="60", job_kwargs={"v": 1}, queue="old", status="paused",
               next_run=T0, last_run=T0, run_count=7, last_job_id=job_id)
    row("sched.retimed", value="900", next_run=T0, last_run=T0)
    Scheduler().sync_code_schedules()
    kept.refresh_from_db()
    assert (kept.job_kwargs, kept.queue, kept.priority) == ({"v": 2}, "sched", 100)
    assert (kept.status, kept.run_count, kept.last_job_id) == ("paused", 7, job_id)
    assert kept.next_run == T0  # same timing: the next tick stands
    retimed = RecurringJob.objects.get(job_name="sched.retimed")
    assert (retimed.schedule_type, retimed.schedule_value) == ("cron", "0 9 * * *")
    assert retimed.next_run > timezone.now()
    assert (retimed.next_run.hour, retimed.next_run.minute) == (9, 0)
    Scheduler().sync_code_schedules()  # again: still one row each
    assert RecurringJob.objects.count() == 2


@pytest.mark.django_db
def test_rows_without_a_code_schedule_are_never_touched():
    scheduled_job("sched.coded", every=60)
    insert_by_hand("reports.daily", "cron", "0 9 * * *")
    before = RecurringJob.objects.filter(job_name="reports.daily").values().get()
    Scheduler().sync_code_schedules()
    assert RecurringJob.objects.filter(job_name="reports.daily").values().get() == before
    assert RecurringJob.objects.count() == 2


# -- rows inserted by hand ------------------------------------------------------


@pytest.mark.django_db
def test_a_hand_inserted_interval_row_is_due_at_once():
    insert_by_hand("reports.hourly", "interval", "3600", '{"kind": "sales"}')
    hand = RecurringJob.objects.get(job_name="reports.hourly")
    assert (hand.status, hand.queue, hand.priority, hand.run_count, hand.next_run) == (
        "active", "default", 100, 0, None)
    [job_id] = Scheduler().run_due(now=T0)
    made = Job.objects.get(id=job_id)
    assert (made.job_name, made.args, made.queue, made.max_attempts) == (
        "reports.hourly", {"kind": "sales"}, "default", 4)
    assert made.dedup_key == tick_dedup_key("reports.hourly", T0)
    hand.refresh_from_db()
    assert hand.next_run == T0 + dt.timedelta(hours=1)


@pytest.mark.django_db
def test_a_hand_inserted_cron_row_waits_for_its_first_fire_time():
    insert_by_hand("reports.daily", "cron", "0 9 * * *")
    assert Scheduler().run_due(now=T0) == []
    hand = RecurringJob.objects.get(job_name="reports.daily")
    assert hand.next_run == T0 + dt.timedelta(hours=23)  # 10:00 → 09:00 the next day
    assert Scheduler().run_due(now=hand.next_run) != []


# -- timing -------------------------------------------------------------------


@pytest.mark.django_db
def test_interval_ticks_keep_their_phase_and_missed_ticks_run_once():
    schedule = row("sched.quarter", value="900", next_run=T0)
    scheduler = Scheduler()
    assert scheduler.run_due(now=T0 - dt.timedelta(seconds=1)) == []
    [first] = scheduler.run_due(now=T0)
    schedule.refresh_from_db()
    assert (schedule.next_run, schedule.last_run, schedule.run_count, schedule.last_job_id) == (
        T0 + dt.timedelta(minutes=15), T0, 1, first)
    late = T0 + dt.timedelta(minutes=47)  # the 10:15, 10:30 and 10:45 ticks were missed
    [second] = scheduler.run_due(now=late)
    schedule.refresh_from_db()
    assert schedule.next_run == T0 + dt.timedelta(hours=1)  # back on the quarter hours
    assert (schedule.last_run, schedule.run_count, schedule.last_job_id) == (late, 2, second)
    keys = [j.dedup_key for j in jobs_of("sched.quarter")]
    assert keys == [tick_dedup_key("sched.quarter", T0),
                    tick_dedup_key("sched.quarter", T0 + dt.timedelta(minutes=15))]


@pytest.mark.django_db
def test_cron_next_run_is_the_next_fire_time_and_missed_ticks_run_once():
    schedule = row("sched.five", kind="cron", value="*/5 * * * *")
    scheduler = Scheduler()
    assert scheduler.run_due(now=T0 + dt.timedelta(minutes=2)) == []
    schedule.refresh_from_db()
    assert schedule.next_run == T0 + dt.timedelta(minutes=5)
    assert len(scheduler.run_due(now=T0 + dt.timedelta(minutes=5))) == 1
    schedule.refresh_from_db()
    assert schedule.next_run == T0 + dt.timedelta(minutes=10)
    assert len(scheduler.run_due(now=T0 + dt.timedelta(minutes=27))) == 1
    schedule.refresh_from_db()
    assert (schedule.next_run, schedule.run_count) == (T0 + dt.timedelta(minutes=30), 2)
    assert len(jobs_of("sched.five")) == 2


@pytest.mark.django_db
def test_the_row_options_are_copied_onto_each_job():
    row("sched.copy", next_run=T0, job_kwargs={"a": [1, 2]}, queue="q1", priority=-3,
        max_attempts=None)
    [job_id] = Scheduler().run_due(now=T0)
    made = Job.objects.get(id=job_id)
    assert (made.args, made.queue, made.priority, made.max_attempts, made.status) == (
        {"a": [1, 2]}, "q1", -3, None, "queued")


# -- pause, bad rows ------------------------------------------------------------


@pytest.mark.django_db
def test_paused_rows_are_not_run_until_resumed():
    paused = row("sched.paused", next_run=T0, status="paused")
    row("sched.paused_new", status="paused")  # NULL next_run stays NULL while paused
    scheduler = Scheduler()
    assert scheduler.run_due(now=T0 + dt.timedelta(hours=1)) == []
    assert RecurringJob.objects.get(job_name="sched.paused_new").next_run is None
    paused.refresh_from_db()
    assert (paused.next_run, paused.run_count) == (T0, 0)
    RecurringJob.objects.filter(pk=paused.pk).update(status="active")
    assert len(scheduler.run_due(now=T0 + dt.timedelta(hours=1))) == 1


@pytest.mark.django_db
def test_a_broken_row_is_logged_and_does_not_stop_the_others(caplog):
    row("sched.bad_cron", kind="cron", value="99 * * * *", next_run=T0)
    row("Not A Valid Name", next_run=T0)
    row("sched.fine", next_run=T0)
    with caplog.at_level(logging.ERROR, logger="soniq_django.scheduler"):
        ids = Scheduler().run_due(now=T0)
    assert [Job.objects.get(id=i).job_name for i in ids] == ["sched.fine"]
    bad_name = RecurringJob.objects.get(job_name="Not A Valid Name")
    assert (bad_name.next_run, bad_name.run_count) == (T0 + dt.timedelta(minutes=1), 0)
    assert RecurringJob.objects.get(job_name="sched.bad_cron").next_run == T0
    assert len(caplog.records) == 2


# -- exactly once ------------------------------------------------------------------


@pytest.fixture
def deferred_sqlite_transactions():
    """On SQLite, let new connections begin transactions DEFERRED (Django's default).

    The suite's settings begin them IMMEDIATE, which would serialize the
    schedulers by itself; the scheduler must not rely on that.
    """
    options = connection.settings_dict.setdefault("OPTIONS", {})
    saved = options.get("transaction_mode")
    if connection.vendor == "sqlite":
        options["transaction_mode"] = "DEFERRED"
    yield
    options["transaction_mode"] = saved


@pytest.mark.django_db(transaction=True)
def test_concurrent_schedulers_enqueue_each_tick_once(deferred_sqlite_transactions):
    names = [f"sched.race_{n}" for n in range(5)]
    for name in names:
        row(name, next_run=T0)
    for minute in range(3):  # three ticks, each raced by six schedulers
        now = T0 + dt.timedelta(minutes=minute)
        batches = run_threads(lambda _i, now=now: Scheduler().run_due(now=now), 6)
        enqueued = [job_id for batch in batches for job_id in batch]
        assert len(enqueued) == len(set(enqueued)) == len(names)
    assert Job.objects.count() == 15
    assert set(RecurringJob.objects.values_list("run_count", flat=True)) == {3}
    assert Job.objects.values("dedup_key").distinct().count() == 15


_CHILD = """
import logging, os, sys
import django
from django.conf import settings

settings.DATABASES["default"]["NAME"] = os.environ["SCHEDULER_TEST_DB"]
django.setup()
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")

from soniq_django import job, periodic

for n in range(5):  # several rows, so that the two processes contend often
    periodic(every=1)(job(name=f"sched.tick_{n}")(lambda: None))

from django.core.management import call_command
call_command("soniq_scheduler", "--interval", "0.05")
"""

_ENQUEUED = re.compile(r"^enqueued (sched\.tick_\d) for (\S+) as job", re.M)


@pytest.mark.django_db(transaction=True)
def test_two_scheduler_processes_enqueue_each_tick_once(tmp_path):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               SCHEDULER_TEST_DB=str(connection.settings_dict["NAME"]))
    started = time.monotonic()
    logs = [tmp_path / f"scheduler-{n}.log" for n in range(2)]
    children = [subprocess.Popen([sys.executable, "-c", _CHILD], cwd=ROOT, env=env,
                                 stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)
                for log in logs]
    # On a loaded machine Django's start-up may take seconds: the window (and
    # the SIGTERM, which the command handles only once it runs) starts when
    # both schedulers say they run.
    assert wait_for(lambda: all("scheduler started" in log.read_text() for log in logs), 60)
    time.sleep(5)
    for child in children:
        child.send_signal(signal.SIGTERM)
    # A scheduler stops after its current tick. On SQLite a tick may wait for
    # the write lock the other one keeps taking every 0.05 s, up to the
    # database's busy timeout (20 s in tests/settings.py; SQLite's waits are
    # not fair, and on a loaded box one process can lose every round): the
    # bound is that timeout plus a tick, not the 20 s it once was here.
    for child in children:
        child.wait(timeout=45)
    outputs = [("", log.read_text()) for log in logs]
    elapsed = time.monotonic() - started
    assert [child.returncode for child in children] == [0, 0], outputs
    logged = [hit for _out, err in outputs for hit in _ENQUEUED.findall(err)]
    assert len(logged) == len(set(logged))  # no process, nor both, enqueued a tick twice
    assert RecurringJob.objects.count() == 5
    for schedule in RecurringJob.objects.all():
        made = jobs_of(schedule.job_name)
        ticks = sorted({j.dedup_key.split(":", 2)[2] for j in made})  # sched:<name>:<tick>
        assert len(ticks) == len(made) == schedule.run_count
        assert len(made) == len([name for name, _tick in logged if name == schedule.job_name])
        assert 2 <= len(made) <= elapsed + 1  # about one a second, never a burst
        instants = [dt.datetime.fromisoformat(t) for t in ticks]
        assert all((b - a) % dt.timedelta(seconds=1) == dt.timedelta(0)
                   for a, b in zip(instants, instants[1:]))


# -- run_forever and the command -------------------------------------------------


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.django_db(transaction=True)
def test_run_forever_writes_code_schedules_runs_hand_rows_and_stops(caplog):
    scheduled_job("sched.coded", every=3600)
    insert_by_hand("sched.hand", "interval", "3600")
    stop = threading.Event()
    with caplog.at_level(logging.INFO, logger="soniq_django.scheduler"):
        thread = threading.Thread(target=Scheduler().run_forever, args=(stop, 0.05))
        thread.start()
        try:
            assert wait_for(lambda: Job.objects.count() == 2)
        finally:
            stop.set()
            thread.join(10)
    assert not thread.is_alive()
    assert sorted(Job.objects.values_list("job_name", flat=True)) == ["sched.coded", "sched.hand"]
    assert len([r for r in caplog.records if r.getMessage().startswith("enqueued")]) == 2


@pytest.mark.django_db(transaction=True)
def test_run_forever_survives_database_errors(monkeypatch, caplog):
    row("sched.after_outage", value="3600")
    real, calls = Scheduler.run_due, []

    def flaky(self, now=None):
        calls.append(now)
        if len(calls) <= 2:
            raise OperationalError("server closed the connection unexpectedly")
        return real(self, now)

    monkeypatch.setattr(Scheduler, "run_due", flaky)
    stop = threading.Event()
    thread = threading.Thread(target=Scheduler().run_forever, args=(stop, 0.01))
    with caplog.at_level(logging.WARNING, logger="soniq_django.scheduler"):
        thread.start()
        try:
            assert wait_for(lambda: Job.objects.filter(job_name="sched.after_outage").exists())
        finally:
            stop.set()
            thread.join(10)
    assert not thread.is_alive()
    assert len([r for r in caplog.records if "database error" in r.getMessage()]) == 2


@pytest.mark.django_db
def test_command_once_runs_one_tick(capsys):
    scheduled_job("sched.cmd", every=60)
    insert_by_hand("sched.cmd_hand", "cron", "0 9 * * *")  # not due yet
    call_command("soniq_scheduler", "--once")
    assert "1 job(s) enqueued" in capsys.readouterr().out
    assert [j.job_name for j in Job.objects.all()] == ["sched.cmd"]
    with pytest.raises(CommandError):
        call_command("soniq_scheduler", "--interval", "0")


@pytest.mark.django_db
def test_run_due_refuses_a_naive_now():
    with pytest.raises(ValueError):
        Scheduler().run_due(now=dt.datetime(2030, 1, 1))

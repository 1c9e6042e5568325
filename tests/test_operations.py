"""Operator actions (used by the admin and commands)."""

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.producer.request import JobRequest
from soniq_django.models import Job, RecurringJob
from soniq_django.operations import (
    cancel_jobs,
    delete_finished,
    delete_finished_rows,
    retry_now,
    retry_now_ids,
    set_schedule_status,
    set_schedule_status_ids,
)
from soniq_django.owned import OwnedJobSource
from soniq_django.throughput import ThroughputCounter, per_minute
from tests.support.concurrency import run_threads
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db


def test_cancel_jobs_cancels_queued_and_asks_running_ones():
    queued = enqueue("a.queued")
    running = enqueue("a.running", priority=1)
    claimed = OwnedJobSource().claim_next_owned("w", claim_token=nonce())
    assert claimed.job_id == running
    report = cancel_jobs([queued, running, uuid.uuid4()])
    assert (report.cancelled, report.requested, report.skipped) == (1, 1, 1)
    assert Job.objects.get(id=queued).status == "cancelled"
    row = Job.objects.get(id=running)
    assert row.status == "processing" and row.cancel_requested


def test_cancel_jobs_reports_a_lapsed_claim_as_cancelled_at_once():
    job_id = enqueue("a.running")
    OwnedJobSource().claim_next_owned("w", claim_token=nonce())
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    report = cancel_jobs([job_id])
    assert (report.cancelled, report.requested, report.skipped) == (1, 0, 0)
    assert Job.objects.get(id=job_id).status == "cancelled"


def test_retry_now_moves_only_waiting_queued_jobs():
    later = enqueue("a.later", run_at=timezone.now() + dt.timedelta(hours=1))
    owned = OwnedJobSource().submit_owned(
        JobRequest("a.owned", {}, run_at=timezone.now() + dt.timedelta(hours=1)), submission_id="s"
    )
    due = enqueue("a.due")
    assert retry_now([later, owned, due]) == 2
    assert Job.objects.get(id=later).scheduled_at <= timezone.now()
    assert Job.objects.get(id=owned).scheduled_at <= timezone.now()


def test_delete_finished_spares_live_and_protected_jobs():
    source = OwnedJobSource()
    owned = source.submit_owned(JobRequest("a.owned", {}), submission_id="s")
    assert source.complete_owned(source.claim_next_owned("w", claim_token=nonce()).claim_fence)
    plain = enqueue("a.plain")
    assert source.complete_owned(source.claim_next_owned("w", claim_token=nonce()).claim_fence)
    queued = enqueue("a.queued")
    assert delete_finished([owned, plain, queued]) == 1
    assert set(Job.objects.values_list("id", flat=True)) == {owned, queued}


def test_pause_and_resume_schedules():
    row = RecurringJob.objects.create(job_name="a.daily", schedule_type="cron",
                                      schedule_value="0 9 * * *")
    assert set_schedule_status([row.id], "paused") == 1
    assert set_schedule_status([row.id], "paused") == 0
    assert RecurringJob.objects.get(id=row.id).status == "paused"
    assert set_schedule_status([row.id], "active") == 1
    with pytest.raises(ValueError):
        set_schedule_status([row.id], "stopped")


def test_throughput_counts_add_up_per_minute():
    counter = ThroughputCounter()
    now = timezone.now()
    for kind in ("done", "done", "failed", "dead_lettered", "cancelled"):
        counter.add("q1", kind, now)
    counter.add("q2", "done", now)
    counter.flush("default")
    counter.add("q1", "done", now)
    counter.flush("default")
    totals = per_minute("default", now - dt.timedelta(minutes=1))
    minute = now.replace(second=0, microsecond=0)
    assert totals[minute] == {"done": 4, "failed": 1, "dead_lettered": 1, "cancelled": 1}
    with pytest.raises(ValueError):
        counter.add("q1", "exploded")


# -- the *_ids/*_rows variants: exactly what this call changed, even racing another --------

def test_the_variants_return_what_they_changed():
    later = timezone.now() + dt.timedelta(hours=1)
    waiting, due = enqueue("a.later", run_at=later), enqueue("a.due")
    assert retry_now_ids([waiting, due]) == [waiting]
    assert retry_now_ids([waiting, due]) == []
    Job.objects.filter(id=due).update(status="done")
    [row] = delete_finished_rows([waiting, due, uuid.uuid4()])
    assert (row.id, row.job_name, row.status) == (due, "a.due", "done")
    assert not Job.objects.filter(id=due).exists()
    schedule = RecurringJob.objects.create(job_name="a.nightly", schedule_type="cron",
                                           schedule_value="0 3 * * *")
    assert set_schedule_status_ids([schedule.id, uuid.uuid4()], "paused") == [schedule.id]
    assert set_schedule_status_ids([schedule.id], "paused") == []


@pytest.mark.django_db(transaction=True)
def test_racing_calls_each_return_only_the_rows_they_changed():
    # Four threads at once on the same rows: each row is reported by one
    # call only (so the admin logs each change once), and all are reported.
    later = timezone.now() + dt.timedelta(hours=1)
    waiting = [enqueue("a.later", {"n": n}, run_at=later) for n in range(40)]
    retried = run_threads(lambda index: retry_now_ids(waiting), 4)
    assert sorted(job_id for ids in retried for job_id in ids) == sorted(waiting)
    Job.objects.filter(id__in=waiting).update(status="done")
    deleted = run_threads(lambda index: [row.id for row in delete_finished_rows(waiting)], 4)
    assert sorted(job_id for ids in deleted for job_id in ids) == sorted(waiting)
    assert not Job.objects.filter(id__in=waiting).exists()
    schedules = [RecurringJob.objects.create(job_name=f"a.nightly_{n}", schedule_type="cron",
                                             schedule_value="0 3 * * *").id for n in range(20)]
    paused = run_threads(lambda index: set_schedule_status_ids(schedules, "paused"), 4)
    assert sorted(i for ids in paused for i in ids) == sorted(schedules)

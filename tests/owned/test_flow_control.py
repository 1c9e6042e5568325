"""Flow control in the claim (protocol v5 and its SQLite twin): pause, concurrency, rate.

Every test runs on both databases through the Python API (OwnedJobSource),
which calls soniq_claim_many on PostgreSQL and SqliteClaims on SQLite.
tests/sql/test_sql_flow_control.py calls the SQL functions directly, and
tests/worker/test_flow_processes.py proves the limits with real workers.
"""

import datetime as dt
import uuid

import pytest
from django.db.models import F
from django.test import override_settings
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue, pause_queue, resume_queue
from soniq_django.errors import ConfigValidationError, ErrorCode, SettingsInvalid
from soniq_django.flow import Limits, configured_limits, parse_rate, queue_states, sync_configured
from soniq_django.models import Job, QueueHold, QueueSetting, QueueStart
from soniq_django.owned import OwnedJobSource
from soniq_django.producer.request import JobRequest
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


def claim(source, n, queues=None, worker="w-1"):
    return source.claim_many_owned(worker, claim_tokens=[nonce() for _ in range(n)],
                                   queues=queues)


def fill(queue, count, **options):
    return bulk_enqueue([JobRequest("flow.job", {"n": n}, queue=queue, **options)
                         for n in range(count)])


def running(queue):
    return Job.objects.filter(queue=queue, status="processing").count()


def limit(queue, **values):
    QueueSetting.objects.update_or_create(queue=queue, defaults=values)


# Pause and resume --------------------------------------------------------------


def test_a_paused_queue_is_skipped_and_the_others_are_claimed(source):
    fill("emails", 3)
    other = fill("reports", 2)
    assert pause_queue("emails", by="ops") is True
    claimed = claim(source, 10)
    assert sorted(c.job_id for c in claimed) == sorted(other)
    assert claim(source, 10, queues=["emails"]) == []
    row = QueueSetting.objects.get(queue="emails")
    assert (row.paused, row.paused_by) == (True, "ops") and row.paused_at is not None
    assert resume_queue("emails") is True
    assert {c.queue for c in claim(source, 10)} == {"emails"}
    assert QueueSetting.objects.get(queue="emails").paused_at is None


def test_pause_and_resume_say_whether_they_changed_anything():
    assert resume_queue("never-paused") is False
    assert not QueueSetting.objects.filter(queue="never-paused").exists()
    assert pause_queue("q") is True
    assert pause_queue("q") is False
    assert resume_queue("q") is True
    assert resume_queue("q") is False


@pytest.mark.parametrize("name", ["", None, 7, "x" * 256, "a\x00b"])
def test_a_queue_name_is_checked_before_any_write(name):
    for call in (pause_queue, resume_queue):
        with pytest.raises(ConfigValidationError) as error:
            call(name)
        assert error.value.code is ErrorCode.INVALID_OPTION
    assert not QueueSetting.objects.exists()


def test_running_jobs_of_a_paused_queue_finish_normally(source):
    fill("emails", 2)
    first, second = claim(source, 2)
    pause_queue("emails")
    assert source.heartbeat_owned(first.claim_fence)
    assert source.complete_owned(first.claim_fence, {"ok": True})
    # A retry goes back to the queue and waits there while it is paused.
    assert source.fail_owned(second.claim_fence, "boom", retry=True)
    rewrite(second.job_id, scheduled_at=None)
    assert claim(source, 5) == []
    resume_queue("emails")
    [again] = claim(source, 5)
    assert (again.job_id, again.attempts) == (second.job_id, 2)


def test_a_row_that_limits_nothing_changes_nothing(source):
    jobs = fill("plain", 3)
    QueueSetting.objects.create(queue="plain")
    assert sorted(c.job_id for c in claim(source, 5)) == sorted(jobs)


# Concurrency -------------------------------------------------------------------


def test_at_most_the_limit_runs_and_a_finished_job_frees_its_slot(source):
    fill("api", 5)
    limit("api", concurrency=2)
    first = claim(source, 4)
    assert len(first) == 2 and running("api") == 2
    assert claim(source, 4, worker="w-2") == []
    assert source.complete_owned(first[0].claim_fence)
    assert len(claim(source, 4, worker="w-2")) == 1
    assert running("api") == 2


def test_complete_and_claim_frees_the_slot_in_the_same_call(source):
    fill("api", 3)
    limit("api", concurrency=1)
    [job] = claim(source, 1)
    completed, claimed = source.complete_many_and_claim_owned(
        [(job.claim_fence, None)], claim_tokens=[nonce(), nonce()])
    assert completed == [True] and len(claimed) == 1 and running("api") == 1


def test_limited_and_unlimited_queues_share_one_claim_in_priority_order(source):
    a = enqueue("flow.job", {"n": 1}, queue="api", priority=10)
    b = enqueue("flow.job", {"n": 2}, queue="api", priority=20)
    c = enqueue("flow.job", {"n": 3}, queue="free", priority=15)
    d = enqueue("flow.job", {"n": 4}, queue="free", priority=30)
    limit("api", concurrency=1)
    assert [j.job_id for j in claim(source, 10)] == [a, c, d]
    assert Job.objects.get(id=b).status == "queued"


def test_a_claim_for_one_queue_is_not_held_back_by_another_queues_limit(source):
    fill("api", 2)
    mine = fill("free", 2)
    limit("api", concurrency=1)
    claim(source, 1, queues=["api"])
    assert sorted(j.job_id for j in claim(source, 5, queues=["free"])) == sorted(mine)


def test_a_processing_job_counts_until_the_reaper_settles_its_lapsed_lease(source):
    [job_id] = fill("api", 1)
    other = fill("api", 1)
    limit("api", concurrency=1)
    [job] = claim(source, 1)
    assert job.job_id == job_id
    # The lease lapsed: the next claim reaps the job (back to queued) before it
    # counts, so the slot is free again and the oldest job is claimed first.
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    [again] = claim(source, 2, worker="w-2")
    assert (again.job_id, again.claim_fence.generation) == (job_id, 2)
    assert Job.objects.get(id=other[0]).status == "queued"


def test_a_processing_job_of_the_queue_counts_whoever_claimed_it(source):
    fill("api", 3)
    limit("api", concurrency=2)
    [mine] = claim(source, 1, queues=["api"])
    # Jobs claimed by a worker serving every queue count as much.
    assert len(claim(source, 5, worker="w-all")) == 1
    assert running("api") == 2 and mine.queue == "api"


def hold(queue, seconds):
    """A slot kept by a handler that outlived its claim, its lease ``seconds`` from now."""
    QueueHold.objects.create(job_id=uuid.uuid4(), generation=1, queue=queue,
                             claim_owner="w-old",
                             lease_expires_at=timezone.now() + dt.timedelta(seconds=seconds))


def test_a_live_hold_takes_a_slot_and_a_lapsed_one_is_deleted(source):
    fill("api", 5)
    limit("api", concurrency=3)
    hold("api", 60)
    hold("api", -1)  # its worker died: it holds nothing any more
    hold("other", 60)  # another queue's
    assert len(claim(source, 5)) == 2
    assert sorted(QueueHold.objects.values_list("queue", flat=True)) == ["api", "other"]
    assert claim(source, 5, worker="w-2") == []
    QueueHold.objects.filter(queue="api").delete()  # its handler returned
    assert len(claim(source, 5, worker="w-2")) == 1


# Rate ----------------------------------------------------------------------------


def age_starts(queue, seconds):
    QueueStart.objects.filter(queue=queue).update(
        started_at=F("started_at") - dt.timedelta(seconds=seconds))


def test_at_most_the_rate_starts_in_a_window_and_the_window_slides(source):
    fill("sms", 10)
    limit("sms", rate_limit=3, rate_period=60)
    first = claim(source, 5)
    assert len(first) == 3
    for job in first:  # finishing does not give a start back
        assert source.complete_owned(job.claim_fence)
    assert claim(source, 5) == []
    starts = list(QueueStart.objects.filter(queue="sms").values_list("started_at", flat=True))
    assert len(starts) == 3
    # The window holds the starts of the last 60 s: not yet ...
    age_starts("sms", 59)
    assert claim(source, 5) == []
    # ... then they leave it, are deleted, and three more may start.
    age_starts("sms", 1)
    assert len(claim(source, 5)) == 3
    assert QueueStart.objects.filter(queue="sms").count() == 3


def test_a_start_is_recorded_at_the_claims_time(source):
    fill("sms", 1)
    limit("sms", rate_limit=5, rate_period=1)
    [job] = claim(source, 1)
    start = QueueStart.objects.get(queue="sms").started_at
    row = Job.objects.get(id=job.job_id)
    assert start == row.updated_at == job.lease_expires_at - dt.timedelta(seconds=30)


def test_rate_and_concurrency_together_take_the_smaller(source):
    fill("api", 10)
    limit("api", concurrency=2, rate_limit=5, rate_period=60)
    jobs = claim(source, 10)
    assert len(jobs) == 2
    for job in jobs:
        source.complete_owned(job.claim_fence)
    second = claim(source, 10)
    assert len(second) == 2
    assert len(claim(source, 10)) == 0  # 4 started, 2 running
    for job in second:
        source.complete_owned(job.claim_fence)
    assert len(claim(source, 10)) == 1  # the rate's fifth


def test_a_queue_without_a_rate_records_no_starts(source):
    fill("api", 2)
    limit("api", concurrency=5)
    claim(source, 2)
    assert not QueueStart.objects.exists()


def test_a_paused_limited_queue_is_skipped_too(source):
    fill("api", 2)
    limit("api", concurrency=5, paused=True)
    assert claim(source, 2) == []


# Which value applies -------------------------------------------------------------


def test_the_rows_override_wins_field_by_field_and_null_falls_back(source):
    fill("api", 10)
    limit("api", configured_concurrency=1, configured_rate_limit=100, configured_rate_period=1)
    assert len(claim(source, 10)) == 1
    QueueSetting.objects.filter(queue="api").update(concurrency=3)
    assert len(claim(source, 10)) == 2  # 3 running now
    # The rate override replaces the configured pair as a whole.
    QueueSetting.objects.filter(queue="api").update(concurrency=None, configured_concurrency=None,
                                                    rate_limit=4, rate_period=60)
    assert len(claim(source, 10)) == 1  # 3 recorded starts + 1 = 4 in the window
    row = QueueSetting.objects.get(queue="api")
    assert (row.effective_concurrency, row.effective_rate) == (None, (4, 60))


# SONIQ["QUEUES"] into the table ------------------------------------------------------


def test_parse_rate():
    assert parse_rate("10/s") == (10, 1)
    assert parse_rate(" 5 / m ") == (5, 60)
    assert parse_rate("1/h") == (1, 3600)
    for bad in ("0/s", "10/d", "10", "ten/s", 10, None, "-1/s", f"{2**31}/s"):
        with pytest.raises(ValueError):
            parse_rate(bad)


@override_settings(SONIQ={"QUEUES": {"emails": {"concurrency": 5, "rate": "10/s"},
                                     "reports": {"rate": "2/m"}}})
def test_sync_writes_the_setting_into_the_configured_columns_and_nothing_else(source):
    QueueSetting.objects.create(queue="emails", concurrency=1, paused=True, paused_by="ops")
    QueueSetting.objects.create(queue="old", configured_concurrency=3)
    assert configured_limits() == {"emails": Limits(5, 10, 1), "reports": Limits(None, 2, 60)}
    assert sync_configured() == ["emails", "old", "reports"]
    rows = {row.queue: row for row in QueueSetting.objects.all()}
    assert (rows["emails"].configured_concurrency, rows["emails"].configured_rate_limit,
            rows["emails"].configured_rate_period) == (5, 10, 1)
    # The operator's values stay: the override wins, the pause holds.
    assert (rows["emails"].concurrency, rows["emails"].paused, rows["emails"].paused_by) == (
        1, True, "ops")
    assert rows["emails"].effective_concurrency == 1
    assert (rows["reports"].effective_concurrency, rows["reports"].effective_rate) == (None,
                                                                                        (2, 60))
    # A queue the setting no longer names loses its configured limits.
    assert rows["old"].configured_concurrency is None
    assert sync_configured() == []  # nothing left to write
    states = {state.queue: state for state in queue_states()}
    assert states["emails"].overridden == ("concurrency",) and states["emails"].paused
    assert all(state.in_sync for state in states.values())


@override_settings(SONIQ={"QUEUES": {"emails": {"concurrency": 0}}})
def test_sync_refuses_an_invalid_setting_and_writes_nothing():
    with pytest.raises(SettingsInvalid) as error:
        sync_configured()
    assert (error.value.code, error.value.key, error.value.check_id) == (
        ErrorCode.SETTINGS_INVALID, "QUEUES", "soniq.E011")
    assert "soniq.E011" in error.value.reason and "dict" in error.value.reason
    assert not QueueSetting.objects.exists()


def test_queue_states_count_the_jobs_and_say_when_the_table_is_behind_the_setting(source):
    fill("api", 3)
    limit("api", configured_concurrency=2)
    claim(source, 1)
    [state] = queue_states()
    assert (state.queue, state.concurrency, state.running, state.queued, state.in_sync) == (
        "api", 2, 1, 2, False)  # SONIQ["QUEUES"] names no limit here

"""depends_on on every enqueue path: waiting, release, failure down the graph, refusals.

Each test runs on SQLite and PostgreSQL (the triggers of sql/workflows_v1.sql and
their SQLite twin), through the public API and the owned claim protocol.
"""

import datetime as dt
import uuid

import pytest
from django.db import connection, transaction

from soniq_django import JobRequest, bulk_enqueue, enqueue, get_job, job
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.models import (WAITING_SCHEDULED_AT, DeadLetterJob, Job, JobDependency,
                                 JobWait)
from soniq_django.operations import cancel_jobs
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="wf.step")
def step(n: int = 0) -> int:
    return n


def claim_all(source: OwnedJobSource) -> dict[uuid.UUID, object]:
    """Every claimable job now: {job id: its ClaimedJob}."""
    claimed = {}
    while True:
        got = source.claim_next_owned("wf-worker", claim_token=nonce())
        if got is None:
            return claimed
        claimed[uuid.UUID(str(got.job_id))] = got


def complete(source: OwnedJobSource, job_id: uuid.UUID, result=None) -> None:
    claimed = claim_all(source)
    assert job_id in claimed, "the job was not claimable"
    assert source.complete_owned(claimed[job_id].claim_fence, result=result) is True
    for other_id, other in claimed.items():  # put the others back untouched
        if other_id != job_id:
            assert source.defer_owned(other.claim_fence, "test") is True


def status(job_id) -> str:
    info = get_job(job_id)
    assert info is not None
    return info.status


def test_a_dependent_waits_until_its_dependency_is_done():
    source = OwnedJobSource()
    first = enqueue("wf.step", {"n": 1})
    second = enqueue("wf.step", {"n": 2}, depends_on=[first])
    row = Job.objects.get(id=second)
    assert row.status == "queued" and row.scheduled_at == WAITING_SCHEDULED_AT
    assert JobWait.objects.get(job_id=second).pending == 1
    claimed = claim_all(source)
    assert set(claimed) == {first}  # the dependent is not claimable
    assert source.complete_owned(claimed[first].claim_fence, result=1) is True
    row = Job.objects.get(id=second)
    assert row.status == "queued" and row.scheduled_at is None
    assert not JobWait.objects.filter(job_id=second).exists()
    assert JobDependency.objects.get(job_id=second).state == "done"
    assert set(claim_all(source)) == {second}


def test_every_dependency_must_be_done():
    source = OwnedJobSource()
    a, b = enqueue("wf.step"), enqueue("wf.step")
    c = enqueue("wf.step", depends_on=[a, b, a])  # a named twice counts once
    assert JobWait.objects.get(job_id=c).pending == 2
    claimed = claim_all(source)
    assert set(claimed) == {a, b}
    assert source.complete_owned(claimed[a].claim_fence) is True
    assert Job.objects.get(id=c).scheduled_at == WAITING_SCHEDULED_AT
    assert source.complete_owned(claimed[b].claim_fence) is True
    assert set(claim_all(source)) == {c}


def test_run_at_is_kept_for_the_release():
    source = OwnedJobSource()
    first = enqueue("wf.step")
    later = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
    second = enqueue("wf.step", run_at=later, depends_on=[first])
    assert Job.objects.get(id=second).scheduled_at == WAITING_SCHEDULED_AT
    complete(source, first)
    assert Job.objects.get(id=second).scheduled_at == later


def test_a_dependency_done_at_enqueue_is_satisfied():
    source = OwnedJobSource()
    first = enqueue("wf.step")
    complete(source, first)
    second = enqueue("wf.step", depends_on=[first])
    row = Job.objects.get(id=second)
    assert row.scheduled_at is None and not JobWait.objects.filter(job_id=second).exists()
    assert JobDependency.objects.get(job_id=second).state == "done"


def test_an_unknown_dependency_is_refused_and_nothing_is_written():
    before = Job.objects.count()
    with pytest.raises(ConfigValidationError) as raised:
        enqueue("wf.step", depends_on=[uuid.uuid4()])
    assert raised.value.code == ErrorCode.UNKNOWN_DEPENDENCY
    assert raised.value.code == "SONIQ_UNKNOWN_DEPENDENCY"
    assert Job.objects.count() == before
    assert not JobDependency.objects.exists()


def test_a_job_cannot_depend_on_itself():
    own = uuid.uuid4()
    with pytest.raises(ConfigValidationError) as raised:
        enqueue("wf.step", job_id=own, depends_on=[own])
    assert raised.value.code == ErrorCode.UNKNOWN_DEPENDENCY
    assert not Job.objects.filter(id=own).exists()


@pytest.mark.parametrize("value", ["not-a-list", [1], ["nope"], {"a": 1}])
def test_bad_depends_on_is_an_invalid_option(value):
    with pytest.raises(ConfigValidationError) as raised:
        enqueue("wf.step", depends_on=value)
    assert raised.value.code == ErrorCode.INVALID_OPTION


def test_a_failed_dependency_cancels_dependents_down_the_graph():
    source = OwnedJobSource()
    root = enqueue("wf.step")
    child = enqueue("wf.step", depends_on=[root])
    grandchild = enqueue("wf.step", depends_on=[child])
    other = enqueue("wf.step")
    both = enqueue("wf.step", depends_on=[other, grandchild])
    claimed = claim_all(source)
    assert set(claimed) == {root, other}
    assert source.fail_owned(claimed[root].claim_fence, "boom", retry=False) is True
    assert DeadLetterJob.objects.filter(id=root).exists()
    for job_id, cause in ((child, root), (grandchild, child), (both, grandchild)):
        info = get_job(job_id)
        assert info.status == "cancelled"
        assert info.last_error == f"dependency_failed:{cause}"
        assert not JobWait.objects.filter(job_id=job_id).exists()
    # The other dependency finishing later changes nothing.
    assert source.complete_owned(claimed[other].claim_fence) is True
    assert status(both) == "cancelled"
    assert claim_all(source) == {}


def test_a_cancelled_dependency_cancels_its_dependents():
    root = enqueue("wf.step")
    child = enqueue("wf.step", depends_on=[root])
    cancel_jobs([root])
    info = get_job(child)
    assert info.status == "cancelled" and info.last_error == f"dependency_failed:{root}"


def test_a_retry_is_not_an_ending():
    source = OwnedJobSource()
    root = enqueue("wf.step", max_attempts=3)
    child = enqueue("wf.step", depends_on=[root])
    claimed = claim_all(source)
    assert source.fail_owned(claimed[root].claim_fence, "again", retry=True) is True
    assert status(child) == "queued"
    assert JobWait.objects.get(job_id=child).pending == 1


def test_a_dependency_failed_before_the_enqueue_cancels_the_new_job_at_once():
    source = OwnedJobSource()
    root = enqueue("wf.step")
    claimed = claim_all(source)
    assert source.fail_owned(claimed[root].claim_fence, "boom", retry=False) is True
    child = enqueue("wf.step", depends_on=[root])
    info = get_job(child)
    assert info.status == "cancelled" and info.last_error == f"dependency_failed:{root}"


def test_a_waiting_job_stays_waiting_when_made_due_by_hand():
    first = enqueue("wf.step")
    second = enqueue("wf.step", depends_on=[first])
    Job.objects.filter(id=second).update(scheduled_at=None)  # "retry now", a hand-made UPDATE
    assert Job.objects.get(id=second).scheduled_at == WAITING_SCHEDULED_AT
    assert JobWait.objects.get(job_id=second).run_at is None


def test_every_enqueue_path_takes_depends_on():
    source = OwnedJobSource()
    root = enqueue("wf.step")
    by_handler = step.configure(depends_on=[root]).enqueue(n=1)
    by_request, plain = bulk_enqueue([JobRequest("wf.step", depends_on=[root]),
                                      JobRequest("wf.step")])
    with transaction.atomic():
        on_commit = step.configure(depends_on=[root]).enqueue_on_commit(n=2)
        assert not Job.objects.filter(id=on_commit).exists()
    waiting = {by_handler, by_request, on_commit}
    assert set(JobWait.objects.values_list("job_id", flat=True)) == waiting
    assert set(claim_all(source)) == {root, plain}


def test_bulk_dependents_may_name_earlier_jobs_of_the_bulk():
    source = OwnedJobSource()
    first_id = uuid.uuid4()
    ids = bulk_enqueue([JobRequest("wf.step", job_id=first_id),
                        JobRequest("wf.step", depends_on=[first_id])])
    assert ids[0] == first_id
    assert set(claim_all(source)) == {first_id}
    # A request cannot depend on a later waiting one: no cycle can be built.
    a, b = uuid.uuid4(), uuid.uuid4()
    with pytest.raises(ConfigValidationError) as raised:
        bulk_enqueue([JobRequest("wf.step", job_id=a, depends_on=[b]),
                      JobRequest("wf.step", job_id=b, depends_on=[a])])
    assert raised.value.code == ErrorCode.UNKNOWN_DEPENDENCY
    assert not Job.objects.filter(id__in=[a, b]).exists()


def test_a_plain_job_is_not_marked():
    first = enqueue("wf.step")
    assert Job.objects.get(id=first).has_dependents is None
    enqueue("wf.step", depends_on=[first])
    assert Job.objects.get(id=first).has_dependents is True


@pytest.mark.postgresql_only
def test_the_sql_api_enqueues_after():
    source = OwnedJobSource()
    first = enqueue("wf.step")
    with connection.cursor() as cursor:
        cursor.execute("SELECT soniq_enqueue_after(ARRAY[%s]::uuid[], 'wf.step')", [first])
        (second,) = cursor.fetchone()
    assert Job.objects.get(id=second).scheduled_at == WAITING_SCHEDULED_AT
    complete(source, first)
    assert Job.objects.get(id=second).scheduled_at is None


@pytest.mark.postgresql_only
def test_the_sql_api_refuses_an_unknown_dependency_with_its_hint():
    from django.db import DatabaseError

    with pytest.raises(DatabaseError) as raised, connection.cursor() as cursor:
        cursor.execute("SELECT soniq_enqueue_after(ARRAY[%s]::uuid[], 'wf.step')",
                       [uuid.uuid4()])
    diag = raised.value.__cause__.diag
    assert diag.sqlstate == "22023" and diag.message_hint == "SONIQ_UNKNOWN_DEPENDENCY"


@pytest.mark.postgresql_only
def test_a_foreign_workers_plain_update_releases_dependents():
    """Soniq 0.1/0.2 complete with their own UPDATE, knowing nothing of workflows."""
    first = enqueue("wf.step")
    second = enqueue("wf.step", depends_on=[first])
    with connection.cursor() as cursor:
        # Soniq's claim: it honours scheduled_at, so it never takes the waiting job.
        cursor.execute("""
            UPDATE soniq_jobs SET status = 'processing', attempts = attempts + 1
             WHERE id = (SELECT id FROM soniq_jobs WHERE status = 'queued'
                          AND (scheduled_at IS NULL OR scheduled_at <= now())
                          ORDER BY priority, created_at LIMIT 1 FOR UPDATE SKIP LOCKED)
            RETURNING id""")
        assert cursor.fetchall() == [(first,)]
        cursor.execute("UPDATE soniq_jobs SET status = 'done' WHERE id = %s", [first])
    assert Job.objects.get(id=second).scheduled_at is None


def test_retry_now_and_run_jobs_leave_a_waiting_job_waiting():
    from soniq_django.operations import retry_now
    from soniq_django.testing import run_jobs

    first = enqueue("wf.step", run_at=dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
    second = enqueue("wf.step", depends_on=[first])
    assert retry_now([second]) == 0
    runs = run_jobs(include_scheduled=True)
    # The second ran only once the first was done (released by its completion).
    assert [run.job_id for run in runs] == [first, second]
    assert status(second) == "done"

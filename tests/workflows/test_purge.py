"""A job's workflow rows go with it (migration 0026, sql/workflows_v2.sql and its SQLite twin).

Housekeeping's purges and plain DELETEs take soniq_job_waits, soniq_job_dependencies,
soniq_batches and soniq_batch_members rows with the jobs; an edge stays while either of
its ends is in a job table, a batch while its callback or any member is. Both databases.
"""

import datetime as dt
import threading
import time
import uuid

import pytest
from django.db import connections, transaction
from django.utils import timezone

from soniq_django import JobRequest, batch, chain, enqueue, get_job, job
from soniq_django.housekeeping import purge_dead_letters, purge_expired
from soniq_django.models import (WAITING_SCHEDULED_AT, Batch, BatchMember, DeadLetterJob, Job,
                                 JobDependency, JobWait)
from soniq_django.owned import OwnedJobSource
from soniq_django.testing import run_jobs
from soniq_django.workflows import batch_members
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)

LATER = dt.timedelta(days=2)


@job(name="wfp.step")
def step(n: int = 0, fail: bool = False) -> int:
    if fail:
        raise RuntimeError("step failed")
    return n


def purge_everything() -> int:
    later = timezone.now() + LATER
    return (purge_expired(now=later)
            + purge_dead_letters(older_than=dt.timedelta(0), now=later))


def workflow_rows() -> dict[str, int]:
    return {"dependencies": JobDependency.objects.count(), "waits": JobWait.objects.count(),
            "batches": Batch.objects.count(), "members": BatchMember.objects.count()}


def claim_only(source: OwnedJobSource, job_id: uuid.UUID):
    """Claim every claimable job, keep ``job_id``'s claim, give the others back."""
    claimed = {}
    while True:
        got = source.claim_next_owned("wfp-worker", claim_token=nonce())
        if got is None:
            break
        claimed[uuid.UUID(str(got.job_id))] = got
    assert job_id in claimed, "the job was not claimable"
    for other_id, other in claimed.items():
        if other_id != job_id:
            assert source.defer_owned(other.claim_fence, "test") is True
    return claimed[job_id]


def test_purging_every_finished_job_leaves_no_workflow_rows():
    first = enqueue("wfp.step", {"n": 1})
    enqueue("wfp.step", {"n": 2}, depends_on=[first])
    chain(JobRequest("wfp.step", {"fail": True}, max_attempts=1),
          JobRequest("wfp.step"), JobRequest("wfp.step"))  # dead letter, then two cancelled
    batch([JobRequest("wfp.step", {"n": n}, max_attempts=1) for n in range(3)]
          + [JobRequest("wfp.step", {"fail": True}, max_attempts=1)],
          on_complete=JobRequest("wfp.step"))
    batch([JobRequest("wfp.step")])  # no callback
    run_jobs(raise_exceptions=False)
    assert not Job.objects.exclude(status__in=["done", "cancelled"]).exists()
    assert DeadLetterJob.objects.count() == 2
    before = workflow_rows()
    assert before == {"dependencies": 1 + 2 + 4, "waits": 0, "batches": 2, "members": 5}
    assert Job.objects.count() + DeadLetterJob.objects.count() == 11
    assert purge_everything() == 11
    assert not Job.objects.exists() and not DeadLetterJob.objects.exists()
    assert workflow_rows() == dict.fromkeys(before, 0)


def test_a_waiting_dependent_is_untouched_by_the_purge_of_unrelated_rows():
    source = OwnedJobSource()
    blocker = enqueue("wfp.step")
    waiting = enqueue("wfp.step", depends_on=[blocker])
    # Unrelated finished work with workflow rows of its own.
    done_first = enqueue("wfp.step")
    done_second = enqueue("wfp.step", depends_on=[done_first])
    other = batch([JobRequest("wfp.step")], on_complete=JobRequest("wfp.step"))
    for job_id in (done_first, done_second, *other.job_ids, other.callback_id):
        assert source.complete_owned(claim_only(source, job_id).claim_fence) is True
    assert purge_everything() == 4
    assert set(Job.objects.values_list("id", flat=True)) == {blocker, waiting}
    assert list(JobDependency.objects.values_list("job_id", "depends_on", "state")) == [
        (waiting, blocker, "waiting")]
    assert JobWait.objects.get(job_id=waiting).pending == 1
    assert Job.objects.get(id=waiting).scheduled_at == WAITING_SCHEDULED_AT
    assert workflow_rows() == {"dependencies": 1, "waits": 1, "batches": 0, "members": 0}
    # It is still released when its dependency is done.
    assert source.complete_owned(claim_only(source, blocker).claim_fence) is True
    assert source.complete_owned(claim_only(source, waiting).claim_fence) is True


def test_an_edge_stays_while_either_end_is_in_a_job_table():
    source = OwnedJobSource()
    first = enqueue("wfp.step")
    second = enqueue("wfp.step", depends_on=[first])
    assert source.complete_owned(claim_only(source, first).claim_fence) is True
    # The dependency is purged; its released dependent still links to it.
    Job.objects.filter(id=first).delete()
    assert list(JobDependency.objects.values_list("job_id", "depends_on", "state")) == [
        (second, first, "done")]
    # The other way round: a dependent deleted while its dependency stays.
    third = enqueue("wfp.step", depends_on=[second])
    Job.objects.filter(id=third).delete()  # deleted while it waited
    assert not JobWait.objects.filter(job_id=third).exists()
    assert JobDependency.objects.filter(job_id=third).count() == 1
    Job.objects.filter(id=second).delete()  # the last end of both edges
    assert workflow_rows() == dict.fromkeys(workflow_rows(), 0)


def test_a_dead_letter_keeps_its_edges_until_it_is_purged():
    first = enqueue("wfp.step", {"fail": True}, max_attempts=1)
    second = enqueue("wfp.step", depends_on=[first])
    run_jobs(raise_exceptions=False)
    assert DeadLetterJob.objects.filter(id=first).exists()
    assert get_job(second).last_error == f"dependency_failed:{first}"
    Job.objects.filter(id=second).delete()
    assert JobDependency.objects.count() == 1  # its dependency is a dead letter still
    DeadLetterJob.objects.filter(id=first).delete()
    assert JobDependency.objects.count() == 0


def test_a_batch_stays_whole_while_its_callback_or_a_member_remains():
    source = OwnedJobSource()
    info = batch([JobRequest("wfp.step", {"n": n}) for n in range(3)],
                 on_complete=JobRequest("wfp.step"))
    for member in info.job_ids:
        assert source.complete_owned(claim_only(source, member).claim_fence) is True
    Job.objects.filter(id__in=info.job_ids[:2]).delete()
    assert workflow_rows()["members"] == 3 and Batch.objects.filter(id=info.id).exists()
    Job.objects.filter(id=info.job_ids[2]).delete()  # every member gone, the callback not
    assert workflow_rows()["members"] == 3 and Batch.objects.filter(id=info.id).exists()
    assert batch_members(info.callback_id) == []  # purged members are left out
    assert source.complete_owned(claim_only(source, info.callback_id).claim_fence) is True
    assert purge_everything() == 1
    assert workflow_rows() == dict.fromkeys(workflow_rows(), 0)


def test_a_batch_whose_callback_goes_first_goes_with_its_last_member():
    info = batch([JobRequest("wfp.step"), JobRequest("wfp.step")],
                 on_complete=JobRequest("wfp.step"))
    Job.objects.filter(id=info.callback_id).delete()
    assert Batch.objects.filter(id=info.id).exists()
    Job.objects.filter(id=info.job_ids[0]).delete()
    assert workflow_rows()["members"] == 2
    Job.objects.filter(id=info.job_ids[1]).delete()
    assert workflow_rows() == dict.fromkeys(workflow_rows(), 0)


@pytest.mark.postgresql_only
@pytest.mark.parametrize("round_", range(3))
def test_two_transactions_deleting_the_two_ends_at_once_leave_no_edge(round_):
    """Each sees the other end still there unless the edge's lock orders them."""
    source = OwnedJobSource()
    first = enqueue("wfp.step")
    second = enqueue("wfp.step", depends_on=[first])
    assert source.complete_owned(claim_only(source, first).claim_fence) is True
    errors: list[BaseException] = []

    def delete_second() -> None:
        try:
            Job.objects.filter(id=second).delete()
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            connections.close_all()

    with transaction.atomic():
        Job.objects.filter(id=first).delete()
        other = threading.Thread(target=delete_second)
        other.start()
        time.sleep(0.3)  # the other DELETE runs now and waits for this one's edge lock
        assert other.is_alive()
    other.join(timeout=10)
    assert not other.is_alive() and errors == []
    assert not Job.objects.exists()
    assert workflow_rows() == dict.fromkeys(workflow_rows(), 0)

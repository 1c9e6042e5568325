"""Item 2: a key's slot is taken by the claim and given back by every ending write, once.

Through OwnedJobSource on both databases (soniq_claim_many and the fenced
SQL functions on PostgreSQL, SqliteClaims on SQLite): the claim, done,
failed (retried and dead-lettered), cancel, a lapsed lease reaped, a
deferral, a timeout's hold. After each step the key's count equals its
processing rows plus its held slots, and no more than its limit run.
"""

import datetime as dt

import pytest
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.keys.models import KEY_PARKED_AT, KeyHold, KeyLimit, KeyParked, KeySlot, KeyStart
from soniq_django.models import DeadLetterJob, Job, QueueHold
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db


def put(key="acme", n=3, limit=1, rate=None, queue="default", **options):
    return [enqueue("keys.job", {"n": i}, queue=queue, concurrency_key=key,
                    key_concurrency=limit, key_rate=rate, **options) for i in range(n)]


def claim(source, n=10, worker="w-1"):
    return source.claim_many_owned(worker, claim_tokens=[nonce() for _ in range(n)])


def slot(key="acme"):
    return KeySlot.objects.get(key=key)


def consistent(key="acme"):
    """The key's count is its processing rows plus its held slots; returns it."""
    row = slot(key)
    processing = Job.objects.filter(concurrency_key=key, status="processing").count()
    held = KeyHold.objects.filter(key=key).count()
    assert row.running == processing + held
    offered = Job.objects.filter(concurrency_key=key, status="queued").exclude(
        scheduled_at=KEY_PARKED_AT)
    assert offered.count() == (row.head is not None)
    parked = Job.objects.filter(concurrency_key=key, status="queued",
                                scheduled_at=KEY_PARKED_AT).count()
    assert KeyParked.objects.filter(key=key).count() == parked
    return row.running


def test_a_key_at_its_limit_offers_nothing_and_the_completion_offers_the_next(source):
    ids = put(n=3, limit=1)
    first = claim(source)
    assert [c.job_id for c in first] == [ids[0]]
    assert consistent() == 1 and slot().head is None
    assert claim(source) == []
    assert source.complete_owned(first[0].claim_fence) is True
    assert consistent() == 0 and slot().head == ids[1]
    assert [c.job_id for c in claim(source)] == [ids[1]]


def test_other_keys_and_plain_jobs_are_not_held_back(source):
    put("a", n=3)
    put("b", n=3)
    plain = enqueue("plain.job", {})
    got = claim(source)
    assert {c.job_id for c in got} >= {plain}
    assert sorted(Job.objects.filter(status="processing").exclude(concurrency_key=None)
                  .values_list("concurrency_key", flat=True)) == ["a", "b"]
    assert consistent("a") == consistent("b") == 1


def test_a_key_of_two_runs_two(source):
    put(n=5, limit=2)
    got = claim(source) + claim(source) + claim(source)
    assert len(got) == 2 and consistent() == 2


def test_a_retried_failure_gives_the_slot_back_and_is_parked_with_its_backoff(source, settings):
    settings.SONIQ = {"RETRY_BASE_SECONDS": 60, "RETRY_MAX_SECONDS": 60}
    ids = put(n=2)
    (got,) = claim(source)
    assert source.fail_owned(got.claim_fence, "boom", retry=True) is True
    assert consistent() == 0
    # The retried job is parked with its backoff; the key's due job is offered meanwhile
    # (decision 0047: a job scheduled for later never blocks the key).
    assert slot().head == ids[1]
    row = KeyParked.objects.get(job_id=ids[0])
    assert row.run_at > timezone.now()
    (second,) = claim(source)
    assert second.job_id == ids[1]
    assert source.complete_owned(second.claim_fence) is True
    # Then the retried job is offered, due after its backoff.
    assert consistent() == 0 and slot().head == ids[0]
    row = Job.objects.get(id=ids[0])
    assert row.status == "queued" and row.scheduled_at > timezone.now()
    assert claim(source) == []


def test_a_dead_letter_gives_the_slot_back(source):
    ids = put(n=2)
    (got,) = claim(source)
    assert source.fail_owned(got.claim_fence, "bad", retry=False) is True
    assert DeadLetterJob.objects.filter(id=ids[0]).exists()
    assert consistent() == 0
    assert [c.job_id for c in claim(source)] == [ids[1]]


def test_a_cancel_gives_the_slot_back_and_a_cancelled_queued_job_leaves_its_place(source):
    ids = put(n=3)
    (got,) = claim(source)
    assert source.request_cancel(ids[1]) is True  # the offered one, cancelled at once
    assert consistent() == 1 and slot().head is None
    assert source.request_cancel(ids[0]) is True
    assert source.acknowledge_cancel_owned(got.claim_fence) is True
    assert consistent() == 0
    assert [c.job_id for c in claim(source)] == [ids[2]]


def test_a_lapsed_lease_is_reaped_by_the_next_claim_and_its_slot_given_back(source):
    ids = put(n=2, max_attempts=3)
    (got,) = claim(source)
    rewrite(got.job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    # The claim reaps first: the lapsed job goes back (parked, oldest: offered again).
    again = claim(source)
    assert [c.job_id for c in again] == [ids[0]]
    assert again[0].claim_fence.generation == got.claim_fence.generation + 1
    assert consistent() == 1


def test_a_deferral_gives_the_slot_and_its_start_back(source):
    ids = put(n=2, rate="10/m")
    (got,) = claim(source)
    assert KeyStart.objects.count() == 1
    assert source.defer_owned(got.claim_fence, "unknown here", delay=0) is True
    assert KeyStart.objects.count() == 0
    assert consistent() == 0
    # Parked again, due from now: behind the job that has been due since it was enqueued
    # (a key offers its due jobs by priority, then by how long each has been due).
    assert [c.job_id for c in claim(source)] == [ids[1]]


def test_a_timed_out_handler_keeps_the_slot_until_its_hold_goes(source, settings):
    settings.SONIQ = {"RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}
    ids = put(n=2, max_attempts=3)
    (got,) = claim(source)
    assert source._fail_and_hold(got.claim_fence, "timed out after 1 s") is True
    assert KeyHold.objects.count() == 1
    assert consistent() == 1  # still running, as far as the key knows
    assert claim(source) == []
    assert source._release_hold(got.claim_fence) is True
    assert consistent() == 0 and KeyHold.objects.count() == 0
    # Its retry is due from now: the job due since it was enqueued goes first.
    assert [c.job_id for c in claim(source)] == [ids[1]]
    # Released once: a second release changes nothing.
    assert source._release_hold(got.claim_fence) is False
    assert consistent() == 1


@pytest.mark.postgresql_only
def test_a_lapsed_hold_is_swept_and_its_slot_given_back(source, settings):
    from django.db import connection
    settings.SONIQ = {"RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}
    put(n=2, max_attempts=3)
    (got,) = claim(source)
    assert source._fail_and_hold(got.claim_fence, "timed out after 1 s") is True
    QueueHold.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    with connection.cursor() as cursor:
        cursor.execute("SELECT soniq_key_sweep()")
        assert cursor.fetchone()[0] == 1
    assert consistent() == 0 and not QueueHold.objects.exists()


def test_a_more_urgent_job_takes_the_offered_place_and_priorities_win_across_keys(source):
    low = put("a", n=1, priority=100)[0]
    urgent = enqueue("keys.job", {}, concurrency_key="a", key_concurrency=1, priority=1)
    assert slot("a").head == urgent
    consistent("a")
    other = enqueue("keys.job", {}, concurrency_key="b", priority=50)
    got = [c.job_id for c in claim(source, n=1)] + [c.job_id for c in claim(source, n=1)]
    assert got == [urgent, other]
    assert Job.objects.get(id=low).scheduled_at == KEY_PARKED_AT


def test_a_run_at_is_kept_while_parked_and_put_back_when_offered(source):
    later = timezone.now() + dt.timedelta(hours=1)
    first, second = put(n=1)[0], enqueue("keys.job", {}, concurrency_key="acme",
                                         key_concurrency=1, run_at=later)
    (got,) = claim(source)
    assert source.complete_owned(got.claim_fence) is True
    row = Job.objects.get(id=second)
    assert abs((row.scheduled_at - later).total_seconds()) < 0.01
    assert claim(source) == [] and first != second


def test_an_operator_override_wins_over_the_declared_limit(source):
    from soniq_django.keys.limits import set_key_limit
    put(n=4, limit=1)
    set_key_limit("default", "acme", concurrency=3)
    got = claim(source) + claim(source) + claim(source)
    assert len(got) == 3 and consistent() == 3
    set_key_limit("default", "ac*", concurrency=None)
    KeyLimit.objects.all().delete()


def test_a_pattern_override_applies_to_matching_keys_only(source):
    from soniq_django.keys.limits import set_key_limit
    put("tenant-1", n=3, limit=None)
    put("other", n=3, limit=None)
    set_key_limit("default", "tenant-*", concurrency=1)
    for _ in range(4):
        claim(source)
    assert consistent("tenant-1") == 1
    assert consistent("other") == 3


def test_the_housekeepings_sweep_gives_back_the_slots_of_lapsed_holds(source, settings):
    from soniq_django.keys.limits import sweep_lapsed_holds
    settings.SONIQ = {"RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}
    put(n=2, max_attempts=3)
    (got,) = claim(source)
    assert source._fail_and_hold(got.claim_fence, "timed out after 1 s") is True
    assert sweep_lapsed_holds("default") == 0  # live: kept
    QueueHold.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert sweep_lapsed_holds("default") == 1
    assert consistent() == 0 and not QueueHold.objects.exists()
    assert source._release_hold(got.claim_fence) is False  # late: nothing given twice
    assert consistent() == 0


def test_run_jobs_runs_a_keys_jobs_one_after_another():
    from soniq_django import job
    from soniq_django.testing import run_jobs

    @job(name="keys.run_me", concurrency_key="tenant", key_concurrency=1)
    def run_me(tenant: str, n: int) -> int:
        assert Job.objects.filter(concurrency_key=tenant, status="processing").count() == 1
        return n

    for n in range(3):
        run_me.enqueue(tenant="t", n=n)
    runs = run_jobs()
    assert [run.result for run in runs] == [0, 1, 2]
    assert consistent("t") == 0
